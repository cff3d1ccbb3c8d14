"""Which connection failures are refusals of the options (fail at once) and which are outages (retry)."""

from __future__ import annotations

from spark_mq.errors import BrokerRefusedError, ConnectionClosedError
from spark_mq.protocol.amqp08.errors import AMQPChannelError, AMQPConnectionError, AuthenticationError
from spark_mq.clients.connect import _fail, refusal


def test_amqp_refusal_codes():
    assert refusal(AuthenticationError(403, "ACCESS_REFUSED - Login was refused"))
    assert refusal(AMQPChannelError(404, "NOT_FOUND - no queue 'q'", 60, 20, "basic.consume", 2))
    assert refusal(AMQPChannelError(406, "PRECONDITION_FAILED - inequivalent arg", 50, 10, "queue.declare", 1))
    assert refusal(AMQPConnectionError(530, "NOT_ALLOWED - vhost not found"))
    # the broker going away or shutting down is an outage
    assert not refusal(AMQPConnectionError(320, "CONNECTION_FORCED - broker forced connection closure"))
    assert not refusal(ConnectionClosedError("connection reset"))
    assert not refusal(OSError(111, "Connection refused"))


def test_fail_is_a_refusal_only_when_every_endpoint_refused():
    refused = _fail("amqp08", ["a", "b"], ["403", "403"], [True, True])
    assert isinstance(refused, BrokerRefusedError) and refusal(refused)
    assert "every amqp08 broker refused" in str(refused)
    mixed = _fail("amqp08", ["a", "b"], ["403", "timed out"], [True, False])
    assert type(mixed) is ConnectionClosedError and not refusal(mixed)
    assert "cannot connect to any amqp08 broker" in str(mixed)


def test_a_refused_protocol_header_fails_the_source_at_once_naming_the_option():
    """Issue 57: RabbitMQ 4 answers AMQP 0-8's header with AMQP 1.0's. A refusal that no retry can change:
    the first failed connect of a source fails it (no 10 s grace, no brokerTimeout), saying what to set."""
    import threading

    import pytest

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.protocol.amqp08.errors import ProtocolRefused
    from spark_mq.sources.reconnect import ReconnectPolicy

    opts = parse_options({"uri": "amqp://127.0.0.1:1/", "queue": "q", "logLocation": "/nonexistent"},
                         format="amqp08", direction=SOURCE)
    policy = ReconnectPolicy("amqp08", opts, threading.Event())
    try:
        raise _fail("amqp08", ["127.0.0.1:1"], ["ProtocolRefused: ..."], [True]) \
            from ProtocolRefused("0-8", b"AMQP\x03\x01\x00\x00")
    except BrokerRefusedError as exc:
        with pytest.raises(BrokerRefusedError, match=r"(?s)every amqp08 broker refused.*option protocol"):
            policy.connect_failed(exc)
    # an ordinary refusal (a wrong password) still gets its grace: the first one is retried
    policy = ReconnectPolicy("amqp08", opts, threading.Event())
    policy._backoff = lambda: 0.0
    policy.connect_failed(AuthenticationError(403, "ACCESS_REFUSED"))
