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
