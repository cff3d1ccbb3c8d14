"""RabbitMQ 4 (the harness's node in a Debian 13 root, broker_rabbitmq4.py): it refuses AMQP 0-8, and the
client says so at once with the fix; it speaks 0-9-1, which the client speaks end to end, on a quorum queue
(4.x's normal case) and a classic one (issue 57)."""

from __future__ import annotations

import time

import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.protocol.amqp08.errors import ProtocolRefused

pytestmark = pytest.mark.integration


def test_rabbitmq4_refuses_0_8_and_the_error_names_the_fix(rabbitmq4):
    t0 = time.monotonic()
    with pytest.raises(ProtocolRefused) as info:
        Connection.from_url(rabbitmq4.url("amqp"), protocol="0-8", connect_timeout=10)
    assert time.monotonic() - t0 < 10  # at once, not at the connect timeout
    err = info.value
    assert (err.offered, err.speaks, err.fits) == ("0-8", "AMQP 1.0 (SASL)", "0-9-1")
    assert "refused AMQP 0-8" in str(err) and "set protocol=0-9-1" in str(err)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
@pytest.mark.parametrize("protocol", ["0-9-1", "auto"])
def test_0_9_1_publish_consume_ack_on_rabbitmq4(rabbitmq4, unique_name, protocol, queue_type):
    queue = unique_name(f"r4-{queue_type}")
    with Connection.from_url(rabbitmq4.url("amqp"), protocol=protocol) as conn:
        assert conn.protocol == "0-9-1"
        version = conn.server_properties["version"]
        assert (version.decode() if isinstance(version, bytes) else version).startswith("4."), version
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        ch.publish_many(("", queue, b"m%d" % i, BasicProperties(message_id=f"id{i}", delivery_mode=2))
                        for i in range(1000))
        ch.basic_qos(prefetch_count=200)  # per consumer: 4.3 refuses global qos
        ch.basic_consume(queue)
        got = []
        while len(got) < 1000:
            msg = ch.next_message(timeout=15)
            got.append((msg.body, msg.properties.message_id))
            ch.basic_ack(msg.delivery_tag)
        assert got == [(b"m%d" % i, f"id{i}") for i in range(1000)]
        ch.queue_delete(queue)
