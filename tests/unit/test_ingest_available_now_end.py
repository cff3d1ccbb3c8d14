"""When availableNow's drain ends, per what the broker tells (issue 43 item 8), on an Ingest that is
never started: its steps are driven by the test with a stand-in consumer. The user-level tests on
real brokers are in tests/integration/test_batch_reads.py."""

from __future__ import annotations

import time

from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.ingest import Ingest

from .test_ingest_groups import _Stub


def _ingest(tmp_path, fmt="malamute", **extra):
    base = {"uri": "tcp://127.0.0.1:1", "mailbox": "m"} if fmt == "malamute" else \
        {"uri": "stomp://127.0.0.1:1", "destination": "/queue/q", "ackMode": "auto"}
    opts = parse_options({**base, "logLocation": str(tmp_path / "log"), **extra}, format=fmt, direction=SOURCE)
    ing = Ingest(fmt, opts, connect=None)
    ing.prepare_available_now = None  # never: the test sets the state prepare_available_now would
    ing._an.active, ing._an.want_depth, ing._an.target_consumed = True, False, None
    ing._an.began, ing._an.began_ms = time.monotonic(), int(time.time() * 1000)
    return ing


class _Consumer(_Stub):
    """Malamute-shaped deliveries ``(body, stamp_ms)``, handed out once."""

    def __init__(self, msgs):
        self.msgs = list(msgs)
        self.heard = time.monotonic()

    def poll(self, max_count, timeout):
        out, self.msgs = self.msgs[:max_count], self.msgs[max_count:]
        return out

    def row(self, msg, offset, now_us):
        return (msg[0], "m", None, now_us, None, False, offset, "s", "m", "subj", "", None)

    def buffered(self):
        return 0


class _Stamping(_Consumer):
    """STOMP-shaped, with ActiveMQ's stamps."""
    broker_stamps = True

    def row(self, msg, offset, now_us):
        return (msg[0], "/queue/q", f"id{offset}", now_us, None, False, offset, "s", None, None, None, None, None)

    def broker_stamp_ms(self, msg):
        return msg[1]


def _steps(ing, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and ing.target is None:
        ing._step()
        time.sleep(0.005)


def test_the_first_message_stamped_after_the_start_ends_the_drain_below_it(tmp_path):
    ing = _ingest(tmp_path, "stomp", quietPeriod="30s")
    before, after = ing._an.began_ms - 1000, ing._an.began_ms + 5
    ing._consumer = _Stamping([(b"a", before), (b"b", before), (b"c", after), (b"d", before)])
    ing._step()
    assert ing.target == 2, "the run ends below the first message sent after it began"
    assert ing.log.head == 4  # the late one and what followed stay in the log for the next run
    ing.log.close()


def test_without_stamps_a_live_destination_ends_at_available_now_timeout(tmp_path):
    ing = _ingest(tmp_path, quietPeriod="30s", availableNowTimeout="1s")
    started = time.monotonic()
    while time.monotonic() - started < 10 and ing.target is None:
        ing._consumer = _Consumer([(b"x", None)])  # one message per step: never quiet
        ing._step()
        time.sleep(0.05)
    assert ing.target is not None and ing.target == ing.log.head > 0
    assert 0.9 <= time.monotonic() - started < 10
    ing.log.close()


def test_a_broker_that_stops_answering_heartbeats_is_not_silent(tmp_path):
    """Malamute: silence counts only up to the broker's last answer; a paused broker does not end
    the drain, and once it answers again after a quiet period without deliveries, it does."""
    ing = _ingest(tmp_path, quietPeriod="0.3s")
    consumer = _Consumer([(b"a", None)])
    consumer.heard_at = lambda: consumer.heard
    ing._consumer = consumer
    ing._step()
    consumer.heard = time.monotonic()  # the last word from the broker: then it pauses
    _steps(ing, 1.5)
    assert ing.target is None, "a paused broker ended the drain"
    consumer.heard = time.monotonic()  # it answers again, having sent nothing for 1.5 s: empty
    _steps(ing, 2)
    assert ing.target == 1
    ing.log.close()
