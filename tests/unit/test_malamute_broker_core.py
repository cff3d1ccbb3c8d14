"""Broker routing core without sockets: replies and silences, routing, bounds, credit, store, fuzzing."""

from __future__ import annotations

import shutil
from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.malamute_broker.core import BrokerCore, Limits
from spark_mq.malamute_broker.store import MailboxStore
from spark_mq.protocol.malamute import codec

OK_FRAMES = [bytes.fromhex("aaa80e00c800")]


class Net:
    """Records what the core sends; ``down`` routing ids are unreachable."""

    def __init__(self, **kwargs) -> None:
        self.out: list[tuple[bytes, list]] = []
        self.down: set[bytes] = set()
        self.room: Optional[int] = None  # messages the peers' queues take before they are full (None: no end)
        self.core = BrokerCore(self.send, **kwargs)
        self.now = 0.0

    def send(self, rid, frames) -> bool:
        if rid in self.down or self.room == 0:
            return False
        if self.room is not None:
            self.room -= 1
        self.out.append((rid, [bytes(f) for f in frames]))
        return True

    def do(self, rid: bytes, message) -> list:
        frames = codec.encode(message) if isinstance(message, codec.Message) else message
        self.out.clear()
        self.core.handle(rid, frames, self.now)
        return [(r, codec.decode(f)) for r, f in self.out]

    def open(self, rid: bytes, address: str = "") -> None:
        assert self.do(rid, codec.ConnectionOpen(address)) == [(rid, codec.Ok())]


def test_replies_and_silences_match_the_reference():
    net = Net()
    assert net.out == []
    net.open(b"A", "a")
    assert net.out[0][1] == OK_FRAMES  # byte for byte as observed: OK 200 ""
    assert net.do(b"A", codec.ConnectionPing()) == [(b"A", codec.ConnectionPong())]
    for msg in (codec.StreamWrite("s"), codec.StreamRead("s", "x"), codec.StreamCancel("s"),
                codec.ServiceOffer("svc", "")):
        assert net.do(b"A", msg) == [(b"A", codec.Ok())]
    for msg in (codec.StreamSend("x", [b"1"]), codec.MailboxSend("nobody", "s"), codec.ServiceSend("other", "s"),
                codec.Credit(5)):
        assert net.do(b"A", msg) == []
    assert net.do(b"A", codec.ConnectionClose()) == [(b"A", codec.Ok())]
    (reply,) = net.do(b"A", codec.ConnectionPing())  # forgotten after CLOSE
    assert isinstance(reply[1], codec.Error) and reply[1].code == 500


def test_unknown_client_gets_error_500_for_anything_but_open():
    net = Net()
    for msg in (codec.ConnectionPing(), codec.StreamSend("x"), codec.StreamWrite("s"), codec.Credit(1)):
        ((rid, reply),) = net.do(b"Z", msg)
        assert isinstance(reply, codec.Error) and reply.code == 500


def test_second_open_is_error_and_deregisters():
    net = Net()
    net.open(b"A", "a")
    ((_, reply),) = net.do(b"A", codec.ConnectionOpen("a"))
    assert isinstance(reply, codec.Error)
    assert b"A" not in net.core.clients


def test_bad_protocol_or_version_is_refused():
    net = Net()
    ((_, reply),) = net.do(b"A", codec.ConnectionOpen("a", "MALAMUTX", 1))
    assert isinstance(reply, codec.Error)
    ((_, reply),) = net.do(b"A", codec.ConnectionOpen("a", "MALAMUTE", 2))
    assert isinstance(reply, codec.Error)


def test_stream_fanout_patterns_no_echo_and_no_duplicates():
    net = Net()
    for rid in (b"P", b"R1", b"R2"):
        net.open(rid, rid.decode())
    net.do(b"P", codec.StreamWrite("s"))
    net.do(b"P", codec.StreamRead("s", ""))  # a writer never gets its own messages
    net.do(b"R1", codec.StreamRead("s", "^temp"))
    net.do(b"R1", codec.StreamRead("s", "temp"))  # overlapping: still delivered once
    net.do(b"R2", codec.StreamRead("s", "hum"))
    out = net.do(b"P", codec.StreamSend("temp.x", [b"1", b"2"]))
    assert out == [(b"R1", codec.StreamDeliver("s", "P", "temp.x", [b"1", b"2"]))]
    assert net.do(b"P", codec.StreamSend("humid", [])) == [(b"R2", codec.StreamDeliver("s", "P", "humid", []))]
    net.do(b"R1", codec.StreamCancel("s"))
    assert net.do(b"P", codec.StreamSend("temp.y")) == []


def test_empty_pattern_matches_empty_subject():
    net = Net()
    net.open(b"P")
    net.open(b"R")
    net.do(b"P", codec.StreamWrite("s"))
    net.do(b"R", codec.StreamRead("s", ""))
    assert len(net.do(b"P", codec.StreamSend(""))) == 1


def test_hanging_or_invalid_patterns_get_error_300():
    net = Net()
    net.open(b"A")
    for pattern in ("*", "+", "a**", "(a*)*", "[", "\\w"):
        for msg in (codec.StreamRead("s", pattern), codec.ServiceOffer("svc", pattern)):
            ((_, reply),) = net.do(b"A", msg)
            assert isinstance(reply, codec.Error) and reply.code == 300, pattern


def test_mailbox_online_offline_fifo_and_own_trackers():
    net = Net()
    net.open(b"S", "sender")
    net.do(b"S", codec.MailboxSend("bob", "one", "t1", 0, [b"1"]))
    net.do(b"S", codec.MailboxSend("bob", "two", "t2", 0, [b"2"]))
    out = net.do(b"B", codec.ConnectionOpen("bob"))
    assert out == [(b"B", codec.Ok()),
                   (b"B", codec.MailboxDeliver("sender", "bob", "one", "t1", [b"1"])),
                   (b"B", codec.MailboxDeliver("sender", "bob", "two", "t2", [b"2"]))]
    assert net.do(b"S", codec.MailboxSend("bob", "three", "", 0, [])) == [
        (b"B", codec.MailboxDeliver("sender", "bob", "three", "", []))]


def test_two_connections_on_one_address_newest_receives_then_older_takes_over():
    net = Net()
    net.open(b"S", "s")
    net.open(b"B1", "bob")
    net.open(b"B2", "bob")
    assert net.do(b"B1", codec.ConnectionPing()) == [(b"B1", codec.ConnectionPong())]  # not evicted
    assert net.do(b"S", codec.MailboxSend("bob", "x"))[0][0] == b"B2"
    net.do(b"B2", codec.ConnectionClose())
    assert net.do(b"S", codec.MailboxSend("bob", "y"))[0][0] == b"B1"


def test_unreachable_owner_keeps_the_mail():
    net = Net()
    net.open(b"S", "s")
    net.open(b"B", "bob")
    net.down.add(b"B")
    net.do(b"S", codec.MailboxSend("bob", "kept"))
    net.down.clear()
    net.do(b"B", codec.ConnectionClose())
    out = net.do(b"B2", codec.ConnectionOpen("bob"))
    assert out[1][1].subject == "kept"


def test_full_client_queue_keeps_mail_in_order_and_retries_while_connected():
    """ROUTER_MANDATORY gives EAGAIN when a connected client's queue is full: the mail stays in the
    mailbox, new mail queues behind it, and retry_backlog() delivers all of it in order once the
    client has room, without the client reconnecting."""
    net = Net()
    net.open(b"S", "s")
    net.open(b"B", "bob")
    net.do(b"S", codec.MailboxSend("bob", "m0"))
    net.down.add(b"B")  # bob's queue is full
    for i in range(1, 4):
        assert net.do(b"S", codec.MailboxSend("bob", f"m{i}")) == []
    assert net.core.backlog_mailboxes == {"bob"}
    net.core.retry_backlog()
    assert net.core.backlog_mailboxes == {"bob"}  # still full
    net.down.clear()
    net.do(b"S", codec.MailboxSend("bob", "m4"))  # behind the waiting mail, not before it
    net.out.clear()
    net.core.retry_backlog()
    assert [codec.decode(f).subject for _, f in net.out] == ["m1", "m2", "m3", "m4"]
    assert not net.core.backlog_mailboxes and "bob" not in net.core.mailboxes


def test_waiting_mail_goes_out_as_room_allows_and_the_store_books_only_what_was_sent(tmp_path):
    """A peer whose queue has room for some of its waiting mail takes that much, in order, with
    every content frame; the rest waits, retried in order; and the store records as delivered
    exactly what was sent, so a broker restarted in between still has the rest, and nothing sent."""
    store = MailboxStore(tmp_path)
    net = Net(store=store)
    net.open(b"S", "s")
    contents = [[], [b"one"], [b"a", b"b", b"c"]] * 4  # 12 mails of 0, 1 and 3 content frames
    for i, content in enumerate(contents):
        net.do(b"S", codec.MailboxSend("bob", f"m{i}", "", 0, content))
    store.flush()
    net.room = 6  # the OK to bob's open, then 5 mails
    out = net.do(b"B", codec.ConnectionOpen("bob"))
    assert out[0] == (b"B", codec.Ok())
    got = [m for _, m in out[1:]]
    assert [m.subject for m in got] == [f"m{i}" for i in range(5)]
    assert [list(m.content) for m in got] == contents[:5]
    assert net.core.backlog_mailboxes == {"bob"} and net.core.stats["unroutable"] == 1
    store.flush()
    assert [subject_of(header) for _, _, header, _ in _restarted(store, tmp_path / "copy")] == \
        [f"m{i}" for i in range(5, 12)]
    net.out.clear()
    net.room = 4
    net.core.retry_backlog()
    assert [codec.decode(f).subject for _, f in net.out] == [f"m{i}" for i in range(5, 9)]
    net.out.clear()
    net.room = 100
    net.core.retry_backlog()
    assert [codec.decode(f).subject for _, f in net.out] == [f"m{i}" for i in range(9, 12)]
    assert not net.core.backlog_mailboxes and "bob" not in net.core.mailboxes
    store.flush()
    assert _restarted(store, tmp_path / "copy2") == []


def _restarted(store: MailboxStore, where) -> list:
    """What a broker restarted on a copy of ``store``'s journal now would load (``load`` rewrites
    the journal it reads, so the running store keeps its own)."""
    shutil.copytree(store.directory, where)
    return MailboxStore(where).load()


def subject_of(header: bytes) -> str:
    return codec.decode([header]).subject


def test_full_worker_queue_keeps_requests_and_retries():
    net = Net()
    net.open(b"C", "c")
    net.open(b"W", "w")
    net.do(b"W", codec.ServiceOffer("svc", "^job"))
    net.down.add(b"W")
    for i in range(3):
        net.do(b"C", codec.ServiceSend("svc", f"job{i}"))
    net.do(b"C", codec.ServiceSend("svc", "other"))  # matches no offer: waits for a matching worker
    assert net.core.backlog_services == {"svc"}
    net.down.clear()
    net.out.clear()
    net.core.retry_backlog()
    assert [codec.decode(f).subject for _, f in net.out] == ["job0", "job1", "job2"]
    assert not net.core.backlog_services
    assert [e.subject for e in net.core.services["svc"].queue] == [b"other"]


def test_service_round_robin_queueing_and_patterns():
    net = Net()
    for rid in (b"C", b"W1", b"W2", b"W3"):
        net.open(rid, rid.decode())
    net.do(b"C", codec.ServiceSend("svc", "early"))  # no worker yet: queued
    assert net.do(b"W1", codec.ServiceOffer("svc", "")) == [
        (b"W1", codec.Ok()), (b"W1", codec.ServiceDeliver("C", "svc", "early", "", []))]
    net.do(b"W2", codec.ServiceOffer("svc", ""))
    net.do(b"W3", codec.ServiceOffer("svc", "^only"))
    targets = [net.do(b"C", codec.ServiceSend("svc", f"r{i}"))[0][0] for i in range(4)]
    assert targets == [b"W1", b"W2", b"W1", b"W2"]
    assert net.do(b"C", codec.ServiceSend("svc", "only-w3"))[0][0] == b"W3"


def test_expiry_forgets_silent_clients_but_keeps_their_mail_address():
    net = Net(client_timeout=5.0)
    net.open(b"A", "a")
    net.now = 3.0
    net.core.tick(net.now)
    assert b"A" in net.core.clients
    net.now = 6.0
    net.core.tick(net.now)
    assert b"A" not in net.core.clients and "a" not in net.core.by_address


def test_stored_message_timeout_expires():
    net = Net()
    net.open(b"S", "s")
    net.do(b"S", codec.MailboxSend("bob", "short", "", 1000, []))
    net.do(b"S", codec.MailboxSend("bob", "forever", "", 0, []))
    net.now = 2.0
    net.core.tick(net.now)
    out = net.do(b"B", codec.ConnectionOpen("bob"))
    assert [m.subject for _, m in out[1:]] == ["forever"]
    assert net.core.stats["expired_messages"] == 1


def test_timed_mail_expires_after_ticks_that_found_none():
    """``tick`` skips the queues while no stored message has a deadline; mail with one, to a
    mailbox or a service, stored after such ticks, still expires, and untimed mail is kept."""
    net = Net()
    net.open(b"S", "s")
    net.do(b"S", codec.MailboxSend("bob", "untimed", "", 0, []))
    for t in (1.0, 2.0):
        net.now = t
        net.core.tick(net.now)
    net.do(b"S", codec.ServiceSend("svc", "job", "", 1000, []))  # each kind alone: one must not hide the other
    net.now = 2.5
    net.core.tick(net.now)  # not yet due
    assert len(net.core.services["svc"].queue) == 1
    net.now = 3.5
    net.core.tick(net.now)
    assert not net.core.services["svc"].queue and net.core.stats["expired_messages"] == 1
    net.do(b"S", codec.MailboxSend("bob", "short", "", 1000, []))
    net.now = 4.0
    net.core.tick(net.now)
    assert [subject_of(e.header) for e in net.core.mailboxes["bob"]] == ["untimed", "short"]
    net.now = 4.6
    net.core.tick(net.now)
    assert [subject_of(e.header) for e in net.core.mailboxes["bob"]] == ["untimed"]
    assert net.core.stats["expired_messages"] == 2
    net.do(b"S", codec.MailboxSend("bob", "later", "", 500, []))  # after a tick that found them all gone
    net.now = 5.2
    net.core.tick(net.now)
    assert net.core.stats["expired_messages"] == 3
    out = net.do(b"B", codec.ConnectionOpen("bob"))
    assert [m.subject for _, m in out[1:]] == ["untimed"]


def test_timed_mail_held_by_the_credit_window_still_expires_once_back_in_its_mailbox():
    """Credit mode: timed mail held for a client without credit is in no queue, so a tick then finds
    no timed mail; when the client goes and the mail returns to its mailbox, it must still expire."""
    net = Net(credit=True)
    net.open(b"S", "s")
    net.open(b"B", "bob")                          # no CREDIT: mail to bob is held, not sent
    net.do(b"S", codec.MailboxSend("bob", "short", "", 1000, []))
    assert len(net.core.clients[b"B"].held) == 1 and "bob" not in net.core.mailboxes
    net.now = 0.5
    net.core.tick(net.now)                         # finds no timed mail in any queue
    net.do(b"B", codec.ConnectionClose())          # the held mail goes back to bob's mailbox
    assert [subject_of(e.header) for e in net.core.mailboxes["bob"]] == ["short"]
    net.now = 2.0
    net.core.tick(net.now)
    assert "bob" not in net.core.mailboxes or not net.core.mailboxes["bob"]
    assert net.core.stats["expired_messages"] == 1


def test_bounded_mailbox_drops_and_counts():
    net = Net(limits=Limits(max_mailbox=2))
    net.open(b"S", "s")
    for i in range(5):
        net.do(b"S", codec.MailboxSend("bob", str(i)))
    assert len(net.core.mailboxes["bob"]) == 2 and net.core.stats["dropped"] == 3


def test_credit_mode_holds_deliveries_until_credit():
    net = Net(credit=True)
    net.open(b"P")
    net.open(b"R")
    net.do(b"P", codec.StreamWrite("s"))
    net.do(b"R", codec.StreamRead("s"))
    for i in range(3):
        assert net.do(b"P", codec.StreamSend(str(i))) == []
    out = net.do(b"R", codec.Credit(2))
    assert [m.subject for _, m in out] == ["0", "1"]
    assert [m.subject for _, m in net.do(b"R", codec.Credit(5))] == ["2"]
    assert len(net.do(b"P", codec.StreamSend("3"))) == 1


def test_credit_ignored_by_default():
    net = Net()
    net.open(b"R")
    assert net.do(b"R", codec.Credit(0)) == []


def test_client_confirm_is_accepted_silently():
    net = Net()
    net.open(b"A")
    assert net.do(b"A", codec.Confirm("t")) == []
    assert net.do(b"A", codec.ConnectionPing()) == [(b"A", codec.ConnectionPong())]


def test_malformed_messages_get_error_and_keep_the_client():
    net = Net()
    net.open(b"A", "a")
    net.do(b"A", codec.StreamWrite("s"))
    for frames in ([b"\xaa\xa9\x02"], [b"\xaa\xa8\x63"], [b"\xaa\xa8"], [b"\xaa\xa8\x02", b"extra"],
                   [b"\xaa\xa8\x07\x09abc"], [b"\xaa\xa8\x05\xffab"], [], [b"\xaa\xa8\x0e\x00\xc8\x00"]):
        ((_, reply),) = net.do(b"A", frames)
        assert isinstance(reply, codec.Error) and reply.code == 500
    assert net.do(b"A", codec.ConnectionPing()) == [(b"A", codec.ConnectionPong())]


def test_persistent_store_round_trip(tmp_path):
    store = MailboxStore(tmp_path)
    assert store.load() == []
    net = Net(store=store)
    net.open(b"S", "s")
    net.do(b"S", codec.MailboxSend("bob", "one", "t1", 0, [b"a", b""]))
    net.do(b"S", codec.MailboxSend("bob", "two", "t2", 0, [b"b"]))
    net.do(b"S", codec.MailboxSend("eve", "three", "", 0, []))
    out = net.do(b"E", codec.ConnectionOpen("eve"))  # eve's message delivered: marked in the journal
    assert out[1][1].subject == "three"
    store.close()
    with open(store.paths[-1], "ab") as f:
        f.write(b"\x00\x00\x00\x30torn")  # a torn record at the tail is ignored
    store2 = MailboxStore(tmp_path)
    net2 = Net(store=store2)
    for seq, address, header, content in store2.load():
        net2.core.restore(address, header, content, seq)
    out = net2.do(b"B", codec.ConnectionOpen("bob"))
    assert [(m.subject, m.tracker, list(m.content)) for _, m in out[1:]] == [("one", "t1", [b"a", b""]),
                                                                            ("two", "t2", [b"b"])]
    store2.close()
    assert MailboxStore(tmp_path).load() == []


def test_store_writes_its_records_before_any_reply_and_at_each_flush(tmp_path):
    store = MailboxStore(tmp_path)
    store.load()
    net = Net(store=store)
    net.open(b"S", "s")
    size = store.paths[-1].stat().st_size
    net.do(b"S", codec.MailboxSend("bob", "one", "", 0, [b"a" * 100]))
    net.do(b"S", codec.MailboxSend("bob", "two", "", 0, [b"b"]))
    assert store.paths[-1].stat().st_size == size  # buffered: no write per record
    assert net.do(b"S", codec.ConnectionPing()) == [(b"S", codec.ConnectionPong())]
    stored = store.paths[-1].stat().st_size
    assert stored > size + 100  # the sender heard back: both records are in the file
    net.do(b"B", codec.ConnectionOpen("bob"))  # both delivered; the OK went out before the deliveries
    assert store.paths[-1].stat().st_size == stored
    store.flush()  # what the loop does at the end of its turn
    assert store.paths[-1].stat().st_size > stored
    reread = MailboxStore(tmp_path)
    assert reread.load() == []  # read from the file alone: stored, then delivered
    reread.close()
    store.close()


def _restored(tmp_path) -> list:
    reread = MailboxStore(tmp_path)
    try:
        return [(seq, address, content) for seq, address, _, content in reread.load()]
    finally:
        reread.close()


def test_a_drained_journal_is_deleted_segment_by_segment_without_rewrites(tmp_path):
    """The journal of a running broker stays bounded by what is undelivered, not by what was ever
    stored: segments roll at ``segment_bytes``, and the oldest ones go once all they stored is
    delivered (nothing is copied when delivery follows storage); sequence numbers go on rising and
    a restart reads back what is left, in order, with its content."""
    store = MailboxStore(tmp_path, segment_bytes=20_000)
    store.load()
    net = Net(store=store)
    net.open(b"S", "s")
    for i in range(200):                                   # ~200 KB for bob, none delivered: kept whole
        net.do(b"S", codec.MailboxSend("bob", f"m{i}", "", 0, [bytes([i]) * 1000]))
        store.flush()                                      # what the loop does at the end of its turn
    assert len(store.paths) >= 10 and store.deleted == 0 and store.journal_bytes > 200_000
    net.do(b"S", codec.MailboxSend("carol", "keep-1", "t", 0, [b"c1", b"second frame"]))
    net.do(b"S", codec.MailboxSend("carol", "keep-2", "", 0, [b"c2"]))
    out = net.do(b"B", codec.ConnectionOpen("bob"))         # all 200 delivered: carol's 2 are what is left
    assert len(out) == 201
    store.flush()
    assert store.relocations == 0 and len(store.paths) == 1 and store.deleted >= 10
    assert sorted(tmp_path.iterdir()) == store.paths       # the deleted segments are gone from the disk
    seq = store.append("dave", b"h", [b"d"])
    assert seq == 203
    store.close()
    assert _restored(tmp_path) == [(201, "carol", [b"c1", b"second frame"]), (202, "carol", [b"c2"]),
                                   (203, "dave", [b"d"])]


def test_a_few_undelivered_records_are_moved_on_so_old_segments_can_go(tmp_path):
    """An oldest segment pinned by a few undelivered records (mail for a client that stays away)
    has them copied to the active segment once it is mostly delivered, then goes; a flush moves at
    most one segment's worth. A restart reads each of them back once, in order."""
    store = MailboxStore(tmp_path, segment_bytes=20_000)
    store.load()
    kept = []
    for round_ in range(20):
        seqs = [store.append("bob", b"", [bytes([round_]) * 1000]) for _ in range(25)]
        kept.append(store.append("away", b"h", [f"keep-{round_}".encode()]))
        for seq in seqs:
            store.delivered(seq)
        store.flush()
    assert store.relocations >= 10
    assert len(store.paths) <= 3 and store.journal_bytes < 3 * 20_000 + 30 * 1100
    store.close()
    restored = _restored(tmp_path)
    assert [seq for seq, *_ in restored] == kept
    assert [content for *_, content in restored] == [[f"keep-{r}".encode()] for r in range(20)]


def test_a_backlog_is_not_copied_while_it_is_mostly_undelivered(tmp_path):
    """Segments full of undelivered mail stay where they are (a backlog costs its bytes once, no
    copies); the journal's size follows the backlog."""
    store = MailboxStore(tmp_path, segment_bytes=20_000)
    store.load()
    seqs = [store.append("bob", b"", [b"x" * 1000]) for _ in range(100)]
    store.flush()
    for seq in seqs[:10]:
        store.delivered(seq)
    store.flush()
    assert store.relocations == 0 and store.deleted == 0 and store.journal_bytes > 100_000
    store.close()
    assert [seq for seq, *_ in _restored(tmp_path)] == seqs[10:]


def test_a_damaged_segment_is_kept_whole_not_dropped(tmp_path, caplog):
    """Moving records on never drops what it cannot read back: an undelivered record damaged on
    disk leaves its segment in place (with a warning naming it), and later ones pile up behind it
    rather than going; the journal still takes appends."""
    store = MailboxStore(tmp_path, segment_bytes=10_000)
    store.load()
    seqs = [store.append("bob", b"", [b"x" * 1000]) for _ in range(30)]
    store.flush()                                           # a full segment, all undelivered: stays
    first = store.paths[0]
    assert len(store.paths) == 2 and store.relocations == 0
    with open(first, "r+b") as f:                           # flip a byte in the first record
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    for seq in seqs[1:]:                                    # all but that one delivered: to be moved on
        store.delivered(seq)
    store.append("bob", b"", [b"y" * 1000])
    with caplog.at_level("WARNING", logger="spark_mq.malamute_broker.store"):
        store.flush()
    assert store.relocations == 0 and first.exists() and store.paths[0] == first
    assert "damaged" in caplog.text and str(first) in caplog.text
    store.append("bob", b"", [b"after"])
    store.close()
    assert [c for *_, c in _restored(tmp_path)][-2:] == [[b"y" * 1000], [b"after"]]


def test_a_journal_of_the_single_file_version_is_read_at_start_up(tmp_path):
    """``mailboxes.journal`` (one file, before segments) is read as the oldest segment and replaced."""
    old = MailboxStore(tmp_path / "scratch")
    old.load()
    seqs = [old.append("bob", b"h", [f"m{i}".encode()]) for i in range(3)]
    old.delivered(seqs[0])
    old.close()
    (old.paths[0]).rename(tmp_path / "mailboxes.journal")
    assert [(seq, content) for seq, _, content in _restored(tmp_path)] == [(2, [b"m1"]), (3, [b"m2"])]
    assert not (tmp_path / "mailboxes.journal").exists()


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"A", b"B", b"C"]),
                          st.lists(st.binary(max_size=24), min_size=0, max_size=3)), max_size=12))
def test_fuzz_core_never_raises(script):
    net = Net()
    net.open(b"A", "a")
    net.do(b"A", codec.StreamWrite("s"))
    net.open(b"B", "b")
    net.do(b"B", codec.StreamRead("s"))
    for rid, frames in script:
        net.core.handle(rid, [b"\xaa\xa8" + f if i == 0 and f[:1] != b"!" else f for i, f in enumerate(frames)],
                        net.now)
    net.out.clear()
    assert net.do(b"B", codec.ConnectionPing())[0][0] == b"B"


def test_a_damaged_older_segment_at_start_up_is_kept_and_named(tmp_path, caplog):
    """Restarting on a journal whose older segment is damaged (not a torn tail: that segment was
    whole before the next began): the records before the damage and every later segment's are
    restored, the loss is logged naming the file, and the file is kept as ``*.damaged``, not deleted."""
    store = MailboxStore(tmp_path, segment_bytes=10_000)
    store.load()
    seqs = []
    for i in range(30):
        seqs.append(store.append("bob", b"", [bytes([i]) * 1000]))
        if i % 10 == 9:
            store.flush()                                    # a segment rolls at a flush past 10,000 bytes
    store.close()
    paths = MailboxStore(tmp_path, segment_bytes=10_000)._files()
    assert len(paths) >= 3
    first = paths[0][1]
    size = first.stat().st_size
    with open(first, "r+b") as f:                            # damage the middle of the oldest segment
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level("WARNING", logger="spark_mq.malamute_broker.store"):
        restored = _restored(tmp_path)
    got = [seq for seq, *_ in restored]
    assert "damaged" in caplog.text and str(first) in caplog.text
    assert first.with_name(first.name + ".damaged").exists() and not first.exists()
    lost = [seq for seq in seqs if seq not in got]
    assert lost and got == [seq for seq in seqs if seq not in lost]    # order kept, nothing invented
    assert all(seqs.index(seq) < 10 for seq in lost)                   # only the damaged segment's tail
    assert got[-1] == seqs[-1]


def test_a_restart_writes_the_backlog_in_segments_of_the_configured_size(tmp_path):
    """What a restart keeps is written in segments of ``segment_bytes`` (not one file of the whole
    backlog, which would be reread whole once mostly delivered), in order, and read back whole."""
    store = MailboxStore(tmp_path, segment_bytes=10_000)
    store.load()
    seqs = [store.append("bob", b"", [bytes([i]) * 1000]) for i in range(45)]
    store.flush()
    store.close()
    again = MailboxStore(tmp_path, segment_bytes=10_000)
    restored = again.load()
    assert [seq for seq, *_ in restored] == seqs
    sizes = [p.stat().st_size for p in again.paths]
    assert len(sizes) >= 4 and all(size < 10_000 + 1_100 for size in sizes), sizes
    assert not list(tmp_path.glob("*.tmp"))
    for seq in seqs[:40]:
        again.delivered(seq)
    again.flush()
    again.close()
    assert [c for *_, c in _restored(tmp_path)] == [[bytes([i]) * 1000] for i in range(40, 45)]
