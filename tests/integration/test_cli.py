"""The ``spark-mq`` command against real brokers: the embedded Malamute broker (started by ``spark-mq
broker`` itself), RabbitMQ (AMQP 0-8 and STOMP) and ActiveMQ (STOMP) from the harness.

Every command runs as a subprocess (``python -m spark_mq.apps.cli``, and once through the installed
``spark-mq`` script) with a timeout; background ``tail`` processes are waited for via their
"listening on" line and always killed at the end.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT = 60
CLI = [sys.executable, "-m", "spark_mq.apps.cli"]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")

pytestmark = pytest.mark.timeout(300)


def run(*args, input=None, timeout=TIMEOUT, cli=CLI):
    return subprocess.run([*cli, *map(str, args)], input=input, capture_output=True, timeout=timeout, env=ENV,
                          stdin=None if input is not None else subprocess.DEVNULL)


def json_lines(out: bytes) -> list:
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


class Background:
    """A CLI process in the background; ``wait_for(text)`` reads its stderr until a line has it."""

    def __init__(self, *args) -> None:
        self.proc = subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=ENV)
        self.err_lines: list[str] = []

    def wait_for(self, text: str, stream: str = "stderr", timeout: float = 30) -> str:
        pipe = self.proc.stderr if stream == "stderr" else self.proc.stdout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], 0.2)
            if ready:
                line = pipe.readline().decode()
                if stream == "stderr":
                    self.err_lines.append(line)
                if text in line:
                    return line
                if not line and self.proc.poll() is not None:
                    break
        self.kill()
        raise AssertionError(f"no {text!r} from {self.proc.args} within {timeout}s; stderr so far: "
                             f"{''.join(self.err_lines)}{self.proc.stderr.read().decode(errors='replace')}")

    def finish(self, timeout: float = TIMEOUT):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return self.proc.returncode, out, "".join(self.err_lines) + err.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture
def background():
    started: list[Background] = []

    def start(*args) -> Background:
        bg = Background(*args)
        started.append(bg)
        return bg

    yield start
    for bg in started:
        bg.kill()


@pytest.fixture
def malamute(background):
    """An embedded Malamute broker run by ``spark-mq broker`` on a free port; yields its endpoint."""
    broker = background("broker", "--endpoint", "tcp://127.0.0.1:0", "--seconds", 240)
    line = broker.wait_for("ready", stream="stdout")
    endpoint = line.split()[1]
    assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":0")
    yield endpoint
    broker.proc.terminate()
    code, _, err = broker.finish(timeout=20)
    assert code == 0, err


# ------------------------------------------------------------------------------------ usage errors

@pytest.mark.parametrize("args, expected", [
    (["send", "http://127.0.0.1:1/", "q", "--body", "x"], "URI 'http://127.0.0.1:1/': unknown scheme 'http'"),
    (["send", "127.0.0.1:5672", "q", "--body", "x"], "no scheme"),
    (["send", "stomp://127.0.0.1:1", "/queue/a", "--body", "x", "--property", "priority=1"],
     "--property does not apply to stomp URIs"),
    (["tail", "tcp://127.0.0.1:1", "s", "--requeue"], "--requeue does not apply to malamute URIs"),
    (["send", "amqp://127.0.0.1:1/", "q"], "give exactly one of --body, --file, --lines (got none"),
    (["send", "amqp://127.0.0.1:1/", "q", "--body", "x", "--file", "y"], "(got --body, --file"),
    (["send", "amqp://127.0.0.1:1/", "q", "--body", "x", "--property", "colour=red"],
     "--property colour=...: not an AMQP basic property"),
    (["send", "amqp://127.0.0.1:1/", "q", "--body", "x", "--property", "priority=high"],
     "--property priority='high': expected an integer"),
    (["send", "amqp://127.0.0.1:1/", "q", "--body", "x", "--header", "novalue"], "--header 'novalue'"),
    (["send", "amqp://127.0.0.1:1/", "--body", "x"], "name a queue"),
    (["send", "tcp://127.0.0.1:1", "s", "--mailbox", "m", "--body", "x"], "(got --stream, --mailbox)"),
    (["send", "stomp://127.0.0.1:1", "--body", "x"], "name a STOMP destination"),
    (["send", "amqp://127.0.0.1:1/", "q", "--body", "x", "--count", "0"], "--count 0"),
    (["send", "amqp://127.0.0.1:1/", "q", "--file", "/nonexistent/body.bin"], "cannot read '/nonexistent/body.bin'"),
    (["tail", "amqp://127.0.0.1:1/", "--routing-key", "k"], "name a queue"),
    (["tail", "amqp://127.0.0.1:1/", "q", "--max", "-1"], "--max -1"),
    (["broker", "--endpoint", "amqp://127.0.0.1:5672"], "--endpoint 'amqp://127.0.0.1:5672'"),
    (["send", "amqp://u:s3cret@127.0.0.1:1/", "q", "--body", "x", "--property", "bad=1"], "not an AMQP basic"),
])
def test_usage_errors_name_the_flag_or_uri(args, expected):
    result = run(*args)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert expected in err
    assert err.startswith(f"spark-mq {args[0]}: error: ")
    assert "s3cret" not in err


def test_connection_failure_exits_1_and_masks_the_password():
    from broker_net import free_ports
    port = free_ports(1)[0]
    result = run("send", f"amqp://user:s3cret@127.0.0.1:{port}/", "q", "--body", "x", "--connect-timeout", 2)
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "cannot connect" in err and f"127.0.0.1:{port}" in err
    assert "s3cret" not in err and "***" in err


def test_help_and_version_and_installed_script():
    result = run("--help")
    assert result.returncode == 0 and b"send" in result.stdout and b"tail" in result.stdout
    script = Path(sys.executable).with_name("spark-mq")
    assert script.exists(), "the spark-mq console script is missing: pip install -e . (./dev setup)"
    result = run("--version", cli=[str(script)])
    assert result.returncode == 0 and result.stdout.decode().startswith("spark-mq ")


# ------------------------------------------------------------------------------------ Malamute

def test_malamute_stream_send_and_tail(malamute, background):
    tail = background("tail", malamute, "orders", "--pattern", "^eu\\.", "--json", "--max", 5, "--timeout", 20)
    tail.wait_for("listening on orders")
    result = run("send", malamute, "orders", "--subject", "eu.{n}", "--body", '{"order": {n}}', "--count", 5)
    assert result.returncode == 0, result.stderr
    assert b"sent 5 messages" in result.stderr
    # not matching the pattern: must not show up
    assert run("send", malamute, "orders", "--subject", "us.1", "--body", "skip").returncode == 0
    code, out, err = tail.finish()
    assert code == 0, err
    records = json_lines(out)
    assert [r["body"] for r in records] == [f'{{"order": {n}}}' for n in range(1, 6)]
    assert [r["subject"] for r in records] == [f"eu.{n}" for n in range(1, 6)]
    assert {r["destination"] for r in records} == {"orders"} and {r["protocol"] for r in records} == {"malamute"}


def test_malamute_mailbox_lines_from_stdin_and_binary_body(malamute, tmp_path):
    # mailbox messages wait in the broker until their owner connects
    result = run("send", malamute, "--mailbox", "alice", "--subject", "note", "--lines", "-",
                 input=b"first\n\nsecond\nthird\n")
    assert result.returncode == 0, result.stderr
    assert b"sent 3 messages" in result.stderr
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)))
    assert run("send", malamute, "--mailbox", "alice", "--file", blob, "--tracker", "t-1").returncode == 0
    result = run("tail", malamute, "--mailbox", "alice", "--json", "--max", 4, "--timeout", 10)
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stdout)
    assert [r["body"] for r in records[:3]] == ["first", "second", "third"]
    assert records[3]["body"] is None and records[3]["tracker"] == "t-1"
    import base64
    assert base64.b64decode(records[3]["body_base64"]) == bytes(range(256))


def test_malamute_service_worker(malamute, background):
    worker = background("tail", malamute, "--service", "resize", "--pattern", "png", "--output", "body",
                        "--max", 2, "--timeout", 20)
    worker.wait_for("listening on resize")
    for n in (1, 2):
        assert run("send", malamute, "--service", "resize", "--subject", "png", "--body", f"img-{n}").returncode == 0
    code, out, err = worker.finish()
    assert code == 0, err
    assert out == b"img-1\nimg-2\n"


def test_tail_timeout_before_max_exits_3(malamute):
    started = time.monotonic()
    result = run("tail", malamute, "quiet", "--max", 2, "--timeout", 1)
    assert result.returncode == 3, result.stderr
    assert b"received 0 of 2 messages before the 1s timeout" in result.stderr
    assert time.monotonic() - started < 30


def test_broker_refuses_a_busy_port(malamute):
    result = run("broker", "--endpoint", malamute, "--seconds", 1)
    assert result.returncode == 1
    assert b"cannot bind" in result.stderr


# ------------------------------------------------------------------------------------ AMQP 0-8

def test_amqp_send_properties_headers_and_tail(rabbitmq, unique_name):
    url = rabbitmq.url("amqp")
    queue = unique_name("cli")
    result = run("send", url, queue, "--declare", "--body", "order {n}", "--count", 3, "--persistent",
                 "-p", "content_type=text/plain", "-p", "priority=7", "-H", "region=eu", "-H", "shard=2")
    assert result.returncode == 0, result.stderr
    result = run("tail", url, queue, "--json", "--max", 3, "--timeout", 10)
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stdout)
    assert [r["body"] for r in records] == ["order 1", "order 2", "order 3"]
    first = records[0]
    assert first["headers"] == {"region": "eu", "shard": "2"}
    assert first["properties"]["content_type"] == "text/plain"
    assert first["properties"]["priority"] == 7 and first["properties"]["delivery_mode"] == 2
    assert first["routing_key"] == queue and first["redelivered"] is False
    # consumed: the queue is empty now
    assert run("tail", url, queue, "--max", 1, "--timeout", 1).returncode == 3


def test_amqp_requeue_peeks(rabbitmq, unique_name):
    url = rabbitmq.url("amqp")
    queue = unique_name("cli")
    assert run("send", url, queue, "--declare", "--body", "keep me").returncode == 0
    peek = run("tail", url, queue, "--requeue", "--json", "--max", 1, "--timeout", 10)
    assert peek.returncode == 0, peek.stderr
    assert json_lines(peek.stdout)[0]["redelivered"] is False
    again = run("tail", url, queue, "--json", "--max", 1, "--timeout", 10)
    record = json_lines(again.stdout)[0]
    assert record["body"] == "keep me" and record["redelivered"] is True


def test_amqp_unroutable_send_fails(rabbitmq, unique_name):
    result = run("send", rabbitmq.url("amqp"), unique_name("nowhere"), "--body", "lost")
    assert result.returncode == 1
    assert b"1 of 1 messages were returned unroutable" in result.stderr
    assert b"--declare" in result.stderr


def test_amqp_exchange_tap(rabbitmq, unique_name, background):
    url = rabbitmq.url("amqp")
    key = unique_name("k")
    # --timeout is an idle timeout, and the tap's queue (exclusive, auto-delete) goes with the tail: with
    # 20 s, a `send` that takes that long to start on a loaded machine finds no binding, the likely cause
    # of this test's one failure (a full run at 67d27d6: the send's message returned unroutable). The tail
    # stops at --max; the timeout only bounds a failure.
    tap = background("tail", url, "--exchange", "amq.topic", "--routing-key", f"{key}.#", "--output", "body",
                     "--max", 2, "--timeout", 50)
    tap.wait_for("listening on")
    for n in (1, 2):
        result = run("send", url, "--exchange", "amq.topic", "--routing-key", f"{key}.eu", "--body", f"tick {n}")
        assert result.returncode == 0, result.stderr
    code, out, err = tap.finish()
    assert code == 0, err
    assert out == b"tick 1\ntick 2\n"


# ------------------------------------------------------------------------------------ STOMP

def test_stomp_send_and_tail(stomp_broker, unique_name, tmp_path):
    url = stomp_broker.url("stomp")
    dest = "/queue/" + unique_name("cli")
    lines = tmp_path / "events.jsonl"
    lines.write_text('{"t": 1}\n{"t": 2}\n')
    result = run("send", url, dest, "--lines", lines, "-H", "region=eu", "--persistent")
    assert result.returncode == 0, result.stderr
    peek = run("tail", url, dest, "--requeue", "--max", 2, "--timeout", 10)
    assert peek.returncode == 0, peek.stderr
    assert peek.stdout.decode().count("region=eu") == 2
    result = run("tail", url, dest, "--json", "--max", 2, "--timeout", 10)
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stdout)
    assert [r["body"] for r in records] == ['{"t": 1}', '{"t": 2}']
    assert records[0]["headers"]["region"] == "eu" and records[0]["destination"] == dest
    assert records[0]["message_id"]
    assert run("tail", url, dest, "--max", 1, "--timeout", 1).returncode == 3


# ------------------------------------------------------------------------------------ the demo

DEMO_TIMEOUT = 420


def _demo(tmp_path, *args, cli=None):
    summary = tmp_path / "summary.json"
    cmd = cli or [sys.executable, "-m", "spark_mq.apps.demo"]
    argv = ["--seconds", 6, "--rate", 150, "--window", 4, "--watermark", 2, "--jitter", 1, "--trigger", 1,
            "--drain-timeout", 90, "--seed", 7, "--summary-json", summary, *args]
    result = subprocess.run([*cmd, *map(str, argv)],
                            capture_output=True, timeout=DEMO_TIMEOUT, env=ENV, stdin=subprocess.DEVNULL)
    out = result.stdout.decode()
    assert result.returncode == 0, f"demo failed:\n{out}\n{result.stderr.decode(errors='replace')[-5000:]}"
    report = json.loads(summary.read_text())
    assert report["verified"] is True and report["exit_code"] == 0
    assert report["produced"] >= 600
    assert report["spark_input_rows"] == report["produced"] + 1  # + the end-of-stream marker
    assert report["windows_matched"] == report["windows_expected"] >= 10  # >= 2 windows x 5 regions
    assert report["windows_missing"] == report["windows_mismatched"] == report["duplicate_results"] == 0
    assert "verified        all" in out and "produced " in out
    return report, out


@pytest.mark.timeout(DEMO_TIMEOUT + 30)
def test_demo_on_the_embedded_malamute_broker(tmp_path):
    report, out = _demo(tmp_path, cli=[*CLI, "demo"])
    assert report["format"] == "malamute" and report["embedded_broker"] is True
    assert "(embedded, in this process)" in out
    # live progress lines (every 5 s when stdout is not a terminal) with rates, batches and backlog
    assert "Spark:" in out and "backlog" in out and "/s)" in out


@pytest.mark.timeout(DEMO_TIMEOUT + 30)
def test_demo_against_rabbitmq_amqp(rabbitmq, tmp_path):
    report, _ = _demo(tmp_path, "--uri", rabbitmq.url("amqp"))
    assert report["format"] == "amqp08" and report["embedded_broker"] is False
    assert "guest:***@" in report["uri"]


@pytest.mark.timeout(DEMO_TIMEOUT + 30)
def test_demo_against_activemq_stomp(activemq, tmp_path):
    report, _ = _demo(tmp_path, "--uri", activemq.url("stomp"))
    assert report["format"] == "stomp"


def test_demo_rejects_a_bad_uri(tmp_path):
    result = subprocess.run([sys.executable, "-m", "spark_mq.apps.demo", "--uri", "http://x"], capture_output=True,
                            timeout=60, env=ENV, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert b"--uri" in result.stderr and b"unknown scheme 'http'" in result.stderr
