"""Unit tests of spark_mq.options (the one options parser) and endpoint resolution in clients.connect."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from spark_mq.errors import OptionError
from spark_mq.options import (
    MASK, SINK, SOURCE, OptionSpec, OptionType, Options, define, parse_options, redact_uri, registered,
)
from spark_mq.clients.connect import endpoints


def amqp(**raw) -> Options:
    return parse_options(raw, format="amqp08", direction=SOURCE)


def test_types_defaults_and_case_insensitive_names():
    opts = amqp(queue="q", maxmessagespertrigger="5", maxBytesPerTrigger="16MiB", fsyncInterval="250ms",
                failOnDataLoss="FALSE", ackmode="Commit", queueArguments='{"x-max-length": 10}', host="a:1,b")
    assert opts.queue == "q"
    assert opts.maxMessagesPerTrigger == 5
    assert opts.maxBytesPerTrigger == 16 << 20
    assert opts.fsyncInterval == pytest.approx(0.25)
    assert opts.failOnDataLoss is False
    assert opts.ackMode == "commit"
    assert opts.queueArguments == {"x-max-length": 10}
    assert opts.host == ("a:1", "b")
    assert opts.includeHeaders is True  # default
    assert opts.prefetch is None
    assert opts.provided == {"queue", "maxMessagesPerTrigger", "maxBytesPerTrigger", "fsyncInterval",
                             "failOnDataLoss", "ackMode", "queueArguments", "host"}
    assert opts["queue"] == "q" and opts.get("nothing", 7) == 7


@pytest.mark.parametrize("text,expected", [("1024", 1024), ("64k", 65536), ("2 MiB", 2 << 20), ("1g", 1 << 30),
                                           ("1.5k", 1536)])
def test_size_syntax(text, expected):
    assert amqp(maxBytesPerTrigger=text).maxBytesPerTrigger == expected


@pytest.mark.parametrize("text,expected", [("2", 2.0), ("250ms", 0.25), ("5s", 5.0), ("2m", 120.0), ("1h", 3600.0)])
def test_duration_syntax(text, expected):
    assert amqp(maxTriggerDelay=text).maxTriggerDelay == pytest.approx(expected)


def test_unknown_option_is_named_with_a_suggestion():
    with pytest.raises(OptionError, match=r"unknown option 'queeu'.*did you mean 'queue'"):
        amqp(queeu="q")


def test_option_of_another_format_says_where_it_belongs():
    with pytest.raises(OptionError, match=r"'destination'.*stomp"):
        amqp(destination="/queue/a")


def test_prefetch_is_refused_for_malamute_which_has_none():
    """The Malamute reader reads a bounded 1 MiB ahead; a ``prefetch`` would silently do nothing."""
    with pytest.raises(OptionError, match=r"'prefetch' for the malamute source.*amqp08/stomp"):
        parse_options({"uri": "tcp://h:9999", "mailbox": "m", "prefetch": "10"}, format="malamute", direction=SOURCE)


def test_every_bad_option_is_reported_at_once():
    with pytest.raises(OptionError) as info:
        amqp(ackMode="sometimes", prefetch="many", bogus="1")
    text = str(info.value)
    assert "'ackMode'" in text and "durable, commit, auto" in text
    assert "'prefetch'" in text and "integer" in text
    assert "'bogus'" in text


def test_bounds():
    with pytest.raises(OptionError, match="'numPartitions'.*minimum"):
        amqp(numPartitions="0")
    with pytest.raises(OptionError, match="'port'.*maximum"):
        amqp(port="70000")


def test_contradicting_options():
    with pytest.raises(OptionError, match="'mailbox' and 'stream' contradict"):
        parse_options({"stream": "s", "mailbox": "m", "uri": "tcp://127.0.0.1:1"}, format="malamute",
                      direction=SOURCE)


def test_secrets_never_in_repr_or_errors():
    opts = amqp(uri="amqp://bob:s3cr3t@h:5672/v", password="hunter2", queue="q")
    shown = repr(opts) + str(opts.redacted())
    assert "s3cr3t" not in shown and "hunter2" not in shown
    assert "amqp://bob:***@h:5672/v" in shown and MASK in shown
    # a bad secret value is not echoed either
    spec = OptionSpec("token", OptionType.INT, secret=True)
    with pytest.raises(OptionError) as info:
        spec.parse("topsecret")
    assert "topsecret" not in str(info.value)
    assert redact_uri("stomp://u:p@h:1") == "stomp://u:***@h:1"
    assert redact_uri("amqp://h:1/v") == "amqp://h:1/v"


def test_frozen_and_picklable():
    opts = amqp(queue="q", password="pw")
    with pytest.raises(AttributeError):
        opts.queue = "other"
    again = pickle.loads(pickle.dumps(opts))
    assert again == opts and again.provided == opts.provided and again.password == "pw"
    changed = opts.replace(queue="r")
    assert changed.queue == "r" and opts.queue == "q"


def test_define_is_idempotent_and_refuses_a_different_meaning(monkeypatch):
    from spark_mq import options

    # a registry of this test's own: the option must not outlive it (the options reference, docs/options.md,
    # is checked against the registry by tests/unit/test_docs_fresh.py, maybe later in the same process)
    monkeypatch.setattr(options, "_REGISTRY", dict(options._REGISTRY))
    spec = OptionSpec("unitTestOnlyOption", OptionType.INT, default=3, formats={"stomp"}, directions={SINK},
                      doc="only for this test")
    define(spec)
    define(spec)
    assert spec in registered("stomp", SINK)
    assert spec not in registered("stomp", SOURCE)
    with pytest.raises(OptionError, match="already defined"):
        define(OptionSpec("unitTestOnlyOption", OptionType.STRING))
    parsed = parse_options({"unitTestOnlyOption": "9", "destination": "/queue/x"}, format="stomp", direction=SINK)
    assert parsed.unitTestOnlyOption == 9


def test_explicit_spec_list_limits_what_is_accepted():
    specs = [OptionSpec("a", OptionType.INT, default=1)]
    assert parse_options({}, specs, format="amqp08", direction=SINK).a == 1
    with pytest.raises(OptionError, match="unknown option 'queue'"):
        parse_options({"queue": "q"}, specs, format="amqp08", direction=SINK)


def test_every_registered_option_is_documented():
    for spec in registered():
        assert spec.doc, spec.name


def test_endpoints_from_uri_hosts_and_overrides():
    eps = endpoints(amqp(uri="amqp://u:p@h1:1000/vh"))
    assert [(e.host, e.port, e.username, e.password, e.virtual_host, e.tls) for e in eps] == [
        ("h1", 1000, "u", "p", "vh", False)]
    eps = endpoints(amqp(uri="amqps://u:p@h1/vh", host="a:1,b", username="x"))
    assert [(e.host, e.port, e.username, e.tls) for e in eps] == [("a", 1, "x", True), ("b", 5671, "x", True)]
    eps = endpoints(amqp(uri="amqp://a:1,amqp://b:2"))
    assert [(e.host, e.port) for e in eps] == [("a", 1), ("b", 2)]
    assert "pw-9f3" not in repr(endpoints(amqp(uri="amqp://u:pw-9f3@h1/vh"))[0])
    stomp = parse_options({"uri": "stomp+ssl://h:7", "tlsVerify": "false"}, format="stomp", direction=SOURCE)
    (ep,) = endpoints(stomp)
    assert (ep.host, ep.port, ep.tls) == ("h", 7, True)
    mlm = parse_options({"uri": "ipc:///tmp/x"}, format="malamute", direction=SOURCE)
    assert endpoints(mlm)[0].zmq_endpoint == "ipc:///tmp/x"
    with pytest.raises(OptionError, match="scheme 'http'"):
        endpoints(amqp(uri="http://u:secret@h"))
    try:
        endpoints(amqp(uri="http://u:secret@h"))
    except OptionError as exc:
        assert "secret" not in str(exc)


@pytest.mark.parametrize("location", ["dbfs:/spark-mq/orders", "s3:/bucket/log"])
def test_a_scheme_with_one_slash_is_refused_at_load_naming_logLocation(location):
    """``dbfs:/x`` is no URI for pyarrow and, as a path, a directory ``dbfs:`` on the driver alone:
    refused when the source is defined (``schema()`` runs at ``load()``), for streams and batch reads."""
    from spark_mq.datasources import MalamuteDataSource

    source = MalamuteDataSource({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": location})
    with pytest.raises(OptionError, match=r"option 'logLocation' is .*needs '(dbfs|s3)://'.*/dbfs/"):
        source.schema()
    with pytest.raises(OptionError, match="logLocation"):
        source.streamReader(None)


@pytest.mark.parametrize("location", ["/dbfs/spark-mq/orders", "file:///tmp/log", "s3://bucket/log", "./dbfs:/x",
                                      "relative/log"])
def test_paths_and_full_uris_pass_the_logLocation_check(location):
    from spark_mq.datasources import MalamuteDataSource

    source = MalamuteDataSource({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": location})
    assert "body" in source.schema()


@pytest.mark.parametrize("given, ping, lost_after", [(None, None, None), ("0.25", 0.25, 4.0), ("10", 10.0, 40.0)])
def test_malamute_heartbeat_stretches_the_silence_that_counts_as_a_lost_broker(given, ping, lost_after):
    """An idle broker speaks only to answer a PING: with ``heartbeat`` 10 s and the default 4 s of
    silence, every idle connection would count as lost. The silence allowed is 4 intervals, at least 4 s;
    without the option the client keeps its own defaults (1 s, 4 s)."""
    from spark_mq.clients.connect import connect_malamute

    made = []

    class Client:
        def __init__(self, endpoint, address, timeout, **kwargs):
            made.append(kwargs)

    raw = {"uri": "tcp://127.0.0.1:1", "mailbox": "m", **({"heartbeat": given} if given else {})}
    connect_malamute(parse_options(raw, format="malamute", direction=SOURCE), client_class=Client)
    assert made[0].get("heartbeat") == ping and made[0].get("server_timeout") == lost_after


def test_a_password_with_an_unencoded_slash_never_shows():
    """``amqp://u:pa/ss@h/``: urlsplit ends the host part at the '/', so no password is parsed and
    the URI used to be shown whole (options, errors, connect warnings)."""
    for uri in ("amqp://u:pa/ss@h:5672/", "amqp://u:12345/x@h/", "stomp://u:p?w@h:61613"):
        assert "pa/ss" not in redact_uri(uri) and "12345" not in redact_uri(uri) and "p?w" not in redact_uri(uri)
        assert redact_uri(uri).startswith(uri.split("://")[0] + "://***@")
        opts = parse_options({"uri": uri, "queue" if uri.startswith("amqp") else "destination": "/queue/q"},
                             format=uri.split(":")[0].replace("amqp", "amqp08"), direction=SOURCE)
        assert "pa/ss" not in repr(opts) and "12345" not in repr(opts)
        with pytest.raises(OptionError) as info:
            endpoints(opts)
        text = str(info.value)
        assert "percent-encoded" in text and "pa/ss" not in text and "12345" not in text and "p?w" not in text
    assert redact_uri("amqp://u:p%2Fss@h/v") == "amqp://u:***@h/v"  # encoded: parsed, masked as before


def test_malamute_port_overrides_a_tcp_uri_and_is_refused_with_ipc():
    mlm = lambda **o: parse_options({"mailbox": "m", **o}, format="malamute", direction=SOURCE)  # noqa: E731
    assert endpoints(mlm(uri="tcp://h:9999", port="10000"))[0].zmq_endpoint == "tcp://h:10000"
    assert endpoints(mlm(uri="tcp://h:9999"))[0].zmq_endpoint == "tcp://h:9999"
    with pytest.raises(OptionError, match="option 'port' does not apply to ipc:///tmp/x"):
        endpoints(mlm(uri="ipc:///tmp/x", port="10000"))


def test_a_stomp_uri_path_is_sent_as_the_connect_host_header(monkeypatch):
    """``stomp://host/vh``: RabbitMQ takes the virtual host from CONNECT's ``host`` header; the path
    used to be parsed and dropped (the default vhost was used)."""
    import spark_mq.clients.stomp as stomp_client
    from spark_mq.clients.connect import connect_stomp

    made = []

    class Client(stomp_client.StompClient):
        def __init__(self, host, port, **kwargs):
            super().__init__(host, port, **kwargs)
            made.append(self._connect_headers)

        def connect(self):
            return self

    monkeypatch.setattr(stomp_client, "StompClient", Client)
    for uri, expected in (("stomp://h:1/orders", {"host": "orders"}), ("stomp://h:1", None), ("stomp://h:1/", None)):
        opts = parse_options({"uri": uri, "destination": "/queue/q"}, format="stomp", direction=SOURCE)
        connect_stomp(opts)
        assert made[-1] == expected, uri
    monkeypatch.undo()
    assert stomp_client.StompClient.from_uri("stomp://h:1/orders")._connect_headers == {"host": "orders"}
    assert stomp_client.StompClient.from_uri("stomp://h:1")._connect_headers is None


@pytest.mark.parametrize("fmt, options", [
    ("malamute", {"uri": "amqp://guest:s3cret@h:5672/", "mailbox": "m"}),
    ("amqp08", {"uri": "stomp://guest:s3cret@h:61613", "queue": "q"}),
    ("stomp", {"uri": "amqp://h:5672/", "destination": "/queue/q"}),
    ("amqp08", {"uri": "amqp://guest:s3cret@h:notaport/", "queue": "q"}),
])
def test_a_uri_of_another_format_fails_at_load(fmt, options):
    """The endpoints are checked when the source is defined (``schema()`` runs at ``load()``) and when
    a sink plans its write (on the driver): the ingest used to meet such a URI only when connecting,
    and retried it as an outage until ``brokerTimeout``. The password stays out of the message."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from spark_mq.registration import data_source_class

    cls = data_source_class(fmt)
    with pytest.raises(OptionError, match="option 'uri'") as exc:
        cls({**options, "logLocation": "/tmp/log"}).schema()
    assert "s3cret" not in str(exc.value)
    sink = {k: v for k, v in options.items() if k == "uri"}
    sink.update({"amqp08": {"routingKey": "q"}, "stomp": {"destination": "/queue/q"},
                 "malamute": {"mailbox": "m"}}[fmt])
    with pytest.raises(OptionError, match="option 'uri'") as exc:
        cls(sink).writer(StructType([StructField("body", BinaryType())]), False)
    assert "s3cret" not in str(exc.value)


class _Conf:
    def __init__(self, values, locked=False):
        self.values, self.locked = dict(values), locked

    def get(self, key):
        return self.values[key]

    def set(self, key, value):
        if self.locked:
            raise RuntimeError("cannot modify the value of a Spark config (test)")
        self.values[key] = value


def test_registering_hides_uri_options_in_plans_once():
    """``register`` extends Spark's option redaction regex by the name ``uri`` (the plans then show
    ``uri=*********(redacted)``; the integration test ``test_secrets_stay_out_of_plans_progress_and_errors``
    shows it in a real session), keeps what was there, and adds it only once."""
    from types import SimpleNamespace

    from spark_mq.registration import REDACTION_CONF, redact_uri_options

    spark = SimpleNamespace(conf=_Conf({REDACTION_CONF: "(?i)url"}))
    regex = redact_uri_options(spark)
    assert regex == spark.conf.values[REDACTION_CONF] == "(?:(?i)url)|(?i:^uri$)"
    assert redact_uri_options(spark) is None and spark.conf.values[REDACTION_CONF] == regex
    locked = SimpleNamespace(conf=_Conf({REDACTION_CONF: "(?i)url"}, locked=True))
    assert redact_uri_options(locked) is None  # a session that refuses the setting still registers


class _DataSources:
    def __init__(self):
        self.registered = []

    def register(self, cls):
        self.registered.append(cls.name())


def test_register_is_a_plain_function_of_the_package():
    """``spark_mq.register(spark)`` is a function of the package, also after ``spark_mq.registration``
    (which holds the work) was imported; importing spark_mq alone does not import pyspark."""
    import types
    from types import SimpleNamespace

    script = "import sys, spark_mq; print('pyspark' in sys.modules, type(spark_mq.register).__name__)"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout.split()
    assert out == ["False", "function"]

    import spark_mq
    import spark_mq.registration

    assert isinstance(spark_mq.register, types.FunctionType)
    spark = SimpleNamespace(dataSource=_DataSources(), conf=_Conf({}, locked=True))
    assert spark_mq.register(spark, ["malamute"]) == ["malamute"]
    assert spark.dataSource.registered == ["malamute"]
