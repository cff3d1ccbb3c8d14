"""The soak run (``./dev soak``, not part of ``./dev test``): every source format and ``ackMode`` under
repeated crashes of the query and of the broker, counting what was lost and what was duplicated.

Cases: amqp08 on RabbitMQ, stomp on RabbitMQ, stomp on ActiveMQ (each with ackMode durable, commit
and auto), malamute on the embedded broker (no acks). Per case:

- a producer thread sends ``--messages`` bodies ``<case>-<seq>`` (unique sequence numbers) to a
  durable destination, persistent, in confirmed groups: an AMQP transaction (tx.commit-ok), a STOMP
  transaction whose COMMIT has a receipt, Malamute mails followed by a PING round trip (the broker
  writes its mailbox journal before it answers). A group that was not confirmed (the broker went
  away) is sent again once the broker is back; its sequence numbers are *ambiguous*: the broker may
  hold them twice, so a duplicate of one of them is the producer's, not the source's, and is
  counted apart. ``sent`` counts the distinct sequence numbers the broker confirmed;
- the query (scripts/soak_query.py, a child process in its own process group) reads the
  destination into an idempotent file sink (foreachBatch, one file per batch id, atomically
  replaced), and is SIGKILLed ``--kills`` times, each time started again on its checkpoint and
  source log. The kills are spread over the run (kill i once the sink holds a random point of the
  i-th share of the messages), each at a random moment up to ``--kill-window`` seconds later, about
  half of them aimed inside a batch (planned in the checkpoint's offsets log, not yet committed);
- the broker is SIGKILLed and restarted ``--broker-restarts`` times while the query runs (the
  private brokers of tests/integration/brokers.py and tests/integration/broker_process.py);
- finally the query runs until every confirmed message is in the sink (or nothing new arrived for
  ``--idle`` seconds), then stops cleanly, and the case prints: sent, read (distinct), lost,
  duplicated (rows minus distinct), of which after a producer resend, kills (and how many of them
  fell inside a batch), broker restarts, duration.

The exit status is 1 when a case lost or duplicated where docs/guarantees.md says its mode does
not: ``durable`` and ``commit`` promise neither loss nor duplicate; ``auto`` (at-most-once) and
Malamute (no broker acks: in-flight messages of a crashed reader are lost) promise no duplicate,
and their losses are reported but are not failures. A sequence number read that the producer never
sent, or a case that could not run, fails too.

    python scripts/soak.py                                   # the full soak: 200,000 x 20 kills x 3
    python scripts/soak.py --messages 20000 --kills 4 --broker-restarts 1 --cases amqp08-rabbitmq-durable
    python scripts/soak.py --consumers 4 --cases amqp08,stomp              # the same with 4 lanes per query

The suite (``./dev test``) kills each case's query twice, once inside a batch and once between two
(tests/integration/killing.py); the repetitions and their statistics are this run's.

Every wait is bounded; brokers and queries are stopped on exit (brokers also by their watchdogs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))  # the brokers' harness, shared with the tests

import brokers  # noqa: E402

QUERY = ROOT / "scripts" / "soak_query.py"
ACK_MODES = ("durable", "commit", "auto")
#: (format, broker) pairs; each runs with every ackMode its format has (Malamute: none)
TARGETS = (("amqp08", "rabbitmq"), ("stomp", "rabbitmq"), ("stomp", "activemq"), ("malamute", "malamute"))
#: modes whose losses docs/guarantees.md allows (at-most-once by design); duplicates fail every mode
LOSSES_ALLOWED = {"auto": "at-most-once by design",
                  "none": "no broker acks: in-flight messages of a crashed reader are lost"}
GROUP = 500               # messages per confirmed producer group
START_WAIT = 300.0        # a query's first new commit after a (re)start, on a busy machine
BROKER_WAIT = 300.0       # the producer's reconnects while a broker restarts
STOP_WAIT = 120.0


def log(msg: str) -> None:
    print(f"[soak {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", flush=True)


@dataclass(frozen=True)
class Case:
    fmt: str
    broker: str
    ack: str  # "none" for Malamute

    @property
    def name(self) -> str:
        return f"{self.fmt}-{self.broker}-{self.ack}"


def all_cases() -> list[Case]:
    return [Case(fmt, broker, ack) for fmt, broker in TARGETS
            for ack in (ACK_MODES if fmt != "malamute" else ("none",))]


# ----------------------------------------------------------------------------------------- brokers


class MalamuteHandle:
    """The embedded Malamute broker as a process, with the mailbox journal on: the kill/restart
    interface of brokers.Broker over broker_process.BrokerProcess (tests/integration)."""

    kind = "malamute"

    def __init__(self, workdir: Path) -> None:
        from broker_process import BrokerProcess

        self._workdir = workdir
        (workdir / "mailboxes").mkdir(parents=True)
        # a reader killed with mail in flight is expired after client_timeout; a large mailbox bound so
        # that a long-stopped query does not make the broker refuse the producer's mail
        self.proc = BrokerProcess(mailbox_dir=str(workdir / "mailboxes"), client_timeout=10.0,
                                  args=("--max-queue", "5000000"), ready_timeout=60.0)

    def start(self) -> "MalamuteHandle":
        self.proc.start()
        return self

    def url(self, scheme: str = "tcp") -> str:
        return self.proc.endpoint

    def kill(self) -> None:
        self.proc.kill()

    def restart(self) -> None:
        self.proc.start()

    def _shutdown(self) -> None:
        self.proc.stop()


def start_broker(kind: str, workdir: Path):
    if kind == "rabbitmq":
        return brokers.start_rabbitmq()
    if kind == "activemq":
        return brokers.start_activemq()
    return MalamuteHandle(workdir / "malamute").start()


# ----------------------------------------------------------------------------------------- producer


class Producer(threading.Thread):
    """Sends ``n`` numbered bodies in confirmed groups, paced at ``rate`` per second, reconnecting
    (bounded by BROKER_WAIT) through broker restarts; see the module docstring for the counts."""

    def __init__(self, case: Case, broker, dest: str, n: int, rate: float) -> None:
        super().__init__(name=f"producer-{case.name}", daemon=True)
        self.case, self.broker, self.dest, self.n, self.rate = case, broker, dest, n, rate
        self.confirmed = 0            # sequence numbers below this are confirmed
        self.ambiguous: set[int] = set()
        self.resends = 0              # attempts after a failed one (while a broker restarts: many)
        self.resent_groups = 0
        self.error: BaseException | None = None
        self.first_group = threading.Event()
        self._halt = threading.Event()
        self._client = None

    def body(self, seq: int) -> bytes:
        return f"{self.case.name}-{seq:09d}".encode()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            seq = 0
            while seq < self.n and not self._halt.is_set():
                group = range(seq, min(seq + GROUP, self.n))
                self._send_confirmed(group)
                seq = group.stop
                self.confirmed = seq
                self.first_group.set()
                ahead = seq / self.rate - (time.monotonic() - t0)
                if ahead > 0:
                    self._halt.wait(ahead)
        except BaseException as exc:  # noqa: BLE001 - reported by the case
            self.error = exc
        finally:
            self.first_group.set()
            self._close()

    def _send_confirmed(self, group: range) -> None:
        deadline = time.monotonic() + BROKER_WAIT
        tried = False
        while True:
            if tried:
                # the previous attempt may have reached the broker: it may hold these twice
                if group.start not in self.ambiguous:
                    self.resent_groups += 1
                self.ambiguous.update(group)
                self.resends += 1
            tried = True
            try:
                if self._client is None:
                    self._client = self._connect()
                self._send(group)
                return
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect and send the group again
                self._close()
                if time.monotonic() > deadline or self._halt.is_set():
                    raise RuntimeError(f"{self.case.name}: producer could not send group {group.start} "
                                       f"for {BROKER_WAIT:.0f}s: {exc}") from exc
                time.sleep(0.5)

    def _connect(self):
        fmt = self.case.fmt
        if fmt == "amqp08":
            from spark_mq.clients.amqp08 import Connection

            conn = Connection.from_url(self.broker.url("amqp"), connect_timeout=5)
            ch = conn.channel()
            ch.queue_declare(self.dest, durable=True)
            ch.tx_select()
            return conn, ch
        if fmt == "stomp":
            from spark_mq.clients.stomp import StompClient

            return StompClient.from_uri(self.broker.url("stomp"), timeout=60).connect()
        from spark_mq.clients.malamute import MalamuteClient

        client = MalamuteClient(self.broker.url(), f"soak-producer-{self.case.name}", timeout=10)
        return client

    def _send(self, group: range) -> None:
        fmt = self.case.fmt
        if fmt == "amqp08":
            from spark_mq.clients.amqp08 import BasicProperties

            _, ch = self._client
            ch.publish_many(("", self.dest, self.body(s), BasicProperties(message_id=f"s{s}", delivery_mode=2))
                            for s in group)
            ch.tx_commit(timeout=60)
        elif fmt == "stomp":
            # send_and_commit, as the stomp sink does: RabbitMQ answers a COMMIT's receipt before the
            # messages are on disk (the first full soak lost the 346 newest of a committed group to a
            # broker SIGKILL), the last SEND's receipt only once they are confirmed
            client = self._client
            persistent = {"persistent": "true"}
            tx = client.begin()
            for s in group[:-1]:
                client.send(self.dest, self.body(s), headers=persistent, transaction=tx)
            client.send_and_commit(tx, self.dest, self.body(group[-1]), headers=persistent, timeout=60)
        else:
            client = self._client
            recoveries = client.recoveries
            for s in group:
                client.sendto(self.dest, "soak", self.body(s))
            client.ping(timeout=30)
            # the client reconnects by itself; mail sent into the old session may be gone
            if client.recoveries != recoveries:
                raise ConnectionError("the Malamute client recovered its session during the group")

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self.case.fmt == "amqp08":
                client[0].close(timeout=2)
            elif self.case.fmt == "stomp":
                client.close()
            else:
                client.close(timeout=1)
        except Exception:  # noqa: BLE001 - the broker may be gone: nothing to close cleanly
            pass


# ----------------------------------------------------------------------------------------- the query


def committed(ckpt: Path, what: str = "commits") -> int:
    """Highest batch id in the checkpoint's ``commits`` (or ``offsets``) log; -1 for none."""
    d = ckpt / what
    try:
        return max((int(f) for f in os.listdir(d) if f.isdigit()), default=-1)
    except FileNotFoundError:
        return -1


class Sink:
    """The rows of a case's file sink, as sequence numbers. A batch file is only ever replaced by a
    replay of its batch, so a file is read again only when its modification time changed."""

    def __init__(self, out: Path, prefix: str) -> None:
        self.out, self.prefix = out, prefix
        self._files: dict = {}  # name -> (mtime_ns, seqs, foreign rows)

    def _read(self, f: Path) -> tuple[list, int]:
        seqs, foreign, prefix = [], 0, self.prefix
        for line in f.read_text().splitlines():
            if line.startswith(prefix):
                seqs.append(int(line[len(prefix):]))
            elif line:
                foreign += 1
        return seqs, foreign

    def rows(self) -> tuple[list[int], int]:
        """Sequence numbers of the rows (with repeats), and how many rows were not ours."""
        for f in self.out.glob("batch-*.txt"):
            mtime = f.stat().st_mtime_ns
            known = self._files.get(f.name)
            if known is None or known[0] != mtime:
                self._files[f.name] = (mtime, *self._read(f))
        seqs = [s for _, got, _ in self._files.values() for s in got]
        return seqs, sum(foreign for _, _, foreign in self._files.values())

    def distinct(self) -> int:
        return len(set(self.rows()[0]))


class Query:
    """One run of scripts/soak_query.py for a case."""

    def __init__(self, config: Path, child_log) -> None:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([sys.executable, str(QUERY), str(config)], stdout=child_log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


# ----------------------------------------------------------------------------------------- one case


@dataclass
class Result:
    case: str
    sent: int = 0
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    dup_resent: int = 0
    unknown: int = 0
    kills: int = 0
    kills_mid_batch: int = 0
    broker_restarts: int = 0
    query_restarts: int = 0
    seconds: float = 0.0
    error: str = ""
    verdict: str = ""
    notes: list = field(default_factory=list)


def source_options(case: Case, broker, dest: str, workdir: Path, args) -> dict:
    opts = {"logLocation": str(workdir / "log"), "maxMessagesPerTrigger": str(args.batch),
            "reconnectDelay": "0.2", "reconnectMaxDelay": "2", "brokerTimeout": "900"}
    if case.fmt == "amqp08":
        opts.update(uri=broker.url("amqp"), queue=dest)
    elif case.fmt == "stomp":
        opts.update(uri=broker.url("stomp"), destination=dest)
    else:
        opts.update(uri=broker.url(), mailbox=dest)
    if case.ack != "none":
        opts["ackMode"] = case.ack
    if args.consumers > 1 and case.fmt != "malamute":
        opts["consumers"] = str(args.consumers)  # lanes (docs/sources.md); the suite kills them twice per case
    return opts


def run_case(case: Case, broker, workdir: Path, args, rng: random.Random) -> Result:
    res = Result(case.name)
    t0 = time.monotonic()
    workdir.mkdir(parents=True)
    out, ckpt, stop = workdir / "out", workdir / "ckpt", workdir / "stop"
    out.mkdir()
    tag = f"soak-{case.name}-{rng.getrandbits(32):08x}"
    dest = {"amqp08": tag, "stomp": f"/queue/{tag}", "malamute": tag}[case.fmt]
    config = workdir / "query.json"
    config.write_text(json.dumps({"format": case.fmt, "options": source_options(case, broker, dest, workdir, args),
                                  "out": str(out), "checkpoint": str(ckpt), "stop": str(stop)}))
    prefix = f"{case.name}-"
    producer = Producer(case, broker, dest, args.messages, args.rate)
    child_log = open(workdir / "query.log", "ab")
    query: Query | None = None

    sink = Sink(out, prefix)
    distinct_read = sink.distinct

    def start() -> Query:
        res.query_restarts += 1
        return Query(config, child_log)

    def started() -> bool:
        """The current run of the query has started its stream (a Spark start takes 30-110 s here)."""
        return (workdir / "query.log").read_bytes().count(b"STARTED\n") >= res.query_restarts

    def drained(quiet: list) -> bool:
        """All sent, and the sink holds all of it, or has not changed for 20 s while the query ran:
        no new batch will come (an at-most-once case may have lost the rest). ``quiet``: [last count,
        since], updated; the quiet time counts only once the query's stream has started."""
        if producer.is_alive():
            return False
        n = distinct_read()
        if n >= producer.confirmed:
            return True
        if n != quiet[0] or not started():
            quiet[:] = [n, time.monotonic()]
        return time.monotonic() - quiet[1] > 20

    def wait_commit(q: Query, after: int, what: str) -> None:
        """Until the query commits a batch past ``after``, or has nothing left to read."""
        deadline = time.monotonic() + START_WAIT
        quiet = [-1, time.monotonic()]
        while committed(ckpt) <= after:
            if not q.alive():
                raise RuntimeError(f"the query exited ({q.proc.returncode}) {what}; see {workdir}/query.log")
            if drained(quiet):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no batch committed within {START_WAIT:.0f}s {what}")
            time.sleep(0.2)

    def wait_read(q: Query, target: int) -> None:
        """Until the sink holds ``target`` distinct messages (bounded: the query may be slow)."""
        deadline = time.monotonic() + START_WAIT + target / args.rate
        quiet = [-1, time.monotonic()]
        while distinct_read() < target:
            if drained(quiet):
                return
            if not q.alive():
                raise RuntimeError(f"the query exited ({q.proc.returncode}); see {workdir}/query.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the query did not read {target} messages in time ({distinct_read()} read)")
            time.sleep(0.5)

    try:
        producer.start()
        if not producer.first_group.wait(BROKER_WAIT) or producer.error:
            raise RuntimeError(f"producer: {producer.error or 'no group confirmed'}")
        if hasattr(broker, "sync"):
            broker.sync()  # RabbitMQ: the new queue's declaration on disk before any kill
        rounds = max(args.kills, args.broker_restarts)
        restart_rounds = set(rng.sample(range(rounds), args.broker_restarts))
        for i in range(rounds):
            query = start()
            wait_commit(query, committed(ckpt), f"after start {res.query_restarts}")
            # spread the kills over the whole run: round i ends once the sink holds a random point of
            # its share of the messages (so that every kill finds messages in flight), then the kill
            # follows at a random moment within --kill-window
            target = int(args.messages * (i + rng.uniform(0.3, 1.0)) / (rounds + 1))
            if i in restart_rounds:
                time.sleep(rng.uniform(0, args.kill_window))
                log(f"{case.name}: broker SIGKILL ({res.broker_restarts + 1}/{args.broker_restarts}), "
                    f"{distinct_read()} read, {producer.confirmed} sent")
                broker.kill()
                time.sleep(rng.uniform(0.5, 3.0))
                broker.restart()
                res.broker_restarts += 1
                wait_commit(query, committed(ckpt), "after the broker restart")
            wait_read(query, target)
            if i < args.kills:
                time.sleep(rng.uniform(0, args.kill_window))
                if rng.random() < 0.5:
                    # every other kill (on average) aims inside a batch (planned in the offsets log, not
                    # yet in the commits log): the replay case; batches run back to back while there
                    # is a backlog, so the next one is planned at once
                    deadline = time.monotonic() + 10
                    while committed(ckpt, "offsets") <= committed(ckpt) and time.monotonic() < deadline:
                        time.sleep(0.01)
                    time.sleep(rng.uniform(0, 0.2))
                mid = committed(ckpt, "offsets") > committed(ckpt)
                query.kill()
                res.kills += 1
                res.kills_mid_batch += mid
                where = "inside a batch" if mid else "between batches"
                log(f"{case.name}: query SIGKILL {res.kills}/{args.kills} ({where}), "
                    f"{distinct_read()} read, {producer.confirmed} sent")
            else:
                stop.touch()
                query.proc.wait(STOP_WAIT)
                stop.unlink()
            query = None
        producer.join(max(60.0, 2 * args.messages / args.rate + BROKER_WAIT))
        if producer.is_alive():
            raise RuntimeError(f"the producer did not finish ({producer.confirmed} of {args.messages} confirmed)")
        if producer.error is not None:
            raise RuntimeError(f"producer: {producer.error}")
        log(f"{case.name}: final run, {producer.confirmed} sent, {distinct_read()} read so far")
        query = start()
        last, last_change = -1, time.monotonic()
        while True:
            n = distinct_read()
            if n != last or not started():  # idle time counts once the stream has started
                last, last_change = n, time.monotonic()
            if n >= producer.confirmed:
                time.sleep(3.0)  # a few more triggers: a duplicate batch would land now
                break
            if not query.alive():
                raise RuntimeError(f"the final query exited ({query.proc.returncode}); see {workdir}/query.log")
            if time.monotonic() - last_change > args.idle:
                res.notes.append(f"final run ended after {args.idle:.0f}s without a new message")
                break
            time.sleep(1.0)
        stop.touch()
        try:
            query.proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            res.notes.append("the final query did not stop in time: killed")
        query.kill()
        query = None
    except Exception as exc:  # noqa: BLE001 - the case fails with its reason; the others still run
        res.error = str(exc)
    finally:
        producer.stop()
        producer.join(30)
        if query is not None:
            query.kill()
        child_log.close()
    seqs, foreign = Sink(out, prefix).rows()
    sent = set(range(producer.confirmed))
    got = set(seqs)
    res.sent = len(sent)
    res.read = len(got & sent)
    res.lost = len(sent - got)
    res.unknown = len(got - sent) + foreign
    res.duplicated = len(seqs) - len(got)
    if res.duplicated:
        counts: dict = {}
        for s in seqs:
            counts[s] = counts.get(s, 0) + 1
        res.dup_resent = sum(c - 1 for s, c in counts.items() if c > 1 and s in producer.ambiguous)
    res.seconds = time.monotonic() - t0
    if producer.resends:
        res.notes.append(f"producer sent {producer.resent_groups} group(s) again ({producer.resends} attempts "
                         f"while the broker was away), {len(producer.ambiguous)} messages")
    res.verdict = verdict(case, res)
    return res


def verdict(case: Case, res: Result) -> str:
    """"ok", "ok (losses allowed: ...)" or "FAIL: ..." against docs/guarantees.md."""
    problems = []
    if res.error:
        problems.append(f"error: {res.error}")
    if res.duplicated - res.dup_resent:
        problems.append(f"{res.duplicated - res.dup_resent} duplicate(s) not explained by a producer resend")
    if res.unknown:
        problems.append(f"{res.unknown} row(s) the producer never had confirmed")
    if res.lost and case.ack not in LOSSES_ALLOWED:
        problems.append(f"{res.lost} lost in ackMode={case.ack}, which promises no loss")
    if problems:
        return "FAIL: " + "; ".join(problems)
    if res.lost:
        return f"ok (losses allowed: {LOSSES_ALLOWED[case.ack]})"
    return "ok"


# ----------------------------------------------------------------------------------------- main


def print_table(results: list[Result]) -> None:
    head = (f"{'case':28} {'sent':>8} {'read':>8} {'lost':>7} {'dup':>6} {'dup*':>5} {'kills':>7} "
            f"{'brk':>3} {'time':>7}  verdict")
    print(head)
    for r in results:
        print(f"{r.case:28} {r.sent:8d} {r.read:8d} {r.lost:7d} {r.duplicated:6d} {r.dup_resent:5d} "
              f"{r.kills:3d}/{r.kills_mid_batch:<3d} {r.broker_restarts:3d} {r.seconds / 60:6.1f}m  {r.verdict}")
    print("read: distinct messages in the sink; lost: sent - read; dup: rows - distinct; dup*: of which after "
          "a producer resend (the broker may hold those twice); kills: SIGKILLs of the query / of those inside "
          "a batch; brk: broker kills and restarts", flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    names = [c.name for c in all_cases()]
    p = argparse.ArgumentParser(prog="./dev soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="cases: " + ", ".join(names))
    p.add_argument("--messages", type=int, default=200_000, help="messages per case (default 200,000)")
    p.add_argument("--kills", type=int, default=20, help="query SIGKILLs per case (default 20)")
    p.add_argument("--broker-restarts", type=int, default=3, help="broker kills and restarts per case (default 3)")
    p.add_argument("--cases", default="all",
                   help="comma-separated case names or prefixes (e.g. amqp08, stomp-activemq-commit); default all")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    p.add_argument("--rate", type=float, default=1000.0, help="producer messages per second (default 1000)")
    p.add_argument("--batch", type=int, default=1000, help="maxMessagesPerTrigger of the query (default 1000)")
    p.add_argument("--kill-window", type=float, default=5.0,
                   help="a kill lands up to this many seconds after the sink reached the round's point (default 5)")
    p.add_argument("--idle", type=float, default=90.0,
                   help="the final run ends after this many seconds without a new message (default 90)")
    p.add_argument("--consumers", type=int, default=1,
                   help="the amqp08 and stomp cases read with this many lanes (the source's consumers option; "
                        "default 1)")
    p.add_argument("--workdir", default=None, help="keep the cases' logs, checkpoints and sinks here")
    args = p.parse_args(argv)
    if args.messages < 1 or args.kills < 0 or args.broker_restarts < 0 or args.rate <= 0 or args.batch < 1 \
            or args.consumers < 1:
        p.error("--messages, --rate, --batch and --consumers must be positive; --kills and --broker-restarts "
                "not negative")
    wanted = [w.strip() for w in args.cases.split(",") if w.strip()]
    if wanted == ["all"]:
        args.selected = all_cases()
    else:
        args.selected = [c for c in all_cases() if any(c.name == w or c.name.startswith(w + "-") for w in wanted)]
        unknown = [w for w in wanted if not any(c.name == w or c.name.startswith(w + "-") for c in all_cases())]
        if unknown or not args.selected:
            p.error(f"unknown case(s) {unknown or wanted}; cases: {', '.join(names)}")
    if args.seed is None:
        args.seed = int(time.time()) % 1_000_000
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="spark-mq-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    log(f"seed {args.seed}; {len(args.selected)} case(s); {args.messages:,} messages, {args.kills} query kills, "
        f"{args.broker_restarts} broker restarts per case; work directory {base}")
    running: dict = {}
    results: list[Result] = []
    try:
        for case in args.selected:
            rng = random.Random(f"{args.seed}-{case.name}")
            log(f"{case.name}: starting")
            try:
                if case.broker not in running:
                    running[case.broker] = start_broker(case.broker, base)
                result = run_case(case, running[case.broker], base / case.name, args, rng)
            except Exception as exc:  # noqa: BLE001 - a broker that cannot start fails this case only
                result = Result(case.name, error=str(exc))
                result.verdict = verdict(case, result)
            results.append(result)
            log(f"{case.name}: done in {result.seconds / 60:.1f} min: sent {result.sent}, read {result.read}, "
                f"lost {result.lost}, duplicated {result.duplicated} ({result.dup_resent} after producer "
                f"resends), {result.kills} kills, {result.broker_restarts} broker restarts: {result.verdict}"
                + "".join(f"; {n}" for n in result.notes if n))
    finally:
        for handle in running.values():
            try:
                handle._shutdown()
            except Exception as exc:  # noqa: BLE001 - report and go on stopping the others
                log(f"could not stop {handle!r}: {exc}")
    print(f"\nsoak, seed {args.seed}, {args.messages:,} messages, {args.kills} query kills, "
          f"{args.broker_restarts} broker restarts per case")
    print_table(results)
    if not args.workdir:
        if all(not r.verdict.startswith("FAIL") for r in results):
            shutil.rmtree(base, ignore_errors=True)
        else:
            log(f"kept {base} (logs of the failed cases)")
    return 1 if any(r.verdict.startswith("FAIL") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
