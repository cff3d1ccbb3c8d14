"""The AMQP client speaking 0-9-1 (``protocol="0-9-1"`` and ``"auto"``) against the harness's RabbitMQ: the
same client and state machine as 0-8 over the 0-9-1 tables (issue 57). RabbitMQ 3.x speaks both versions;
4.x speaks 0-9-1 only."""

from __future__ import annotations

import time

import pika
import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.errors import LocalProtocolError
from spark_mq.protocol.amqp08 import spec091
from spark_mq.protocol.amqp08.errors import AMQPChannelError

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("protocol", ["0-9-1", "auto"])
def test_0_9_1_end_to_end_beside_pika(rabbitmq, unique_name, protocol):
    """Declare, bind and unbind, publish 2,000 (read back by pika), consume pika's 500 with acks, get,
    reject, recover, and a channel error: each method is 0-9-1's (connection.close is 50, not 0-8's 60)."""
    queue, other = unique_name("q091"), unique_name("q091-pika")
    with Connection.from_url(rabbitmq.url("amqp"), protocol=protocol) as conn:
        assert conn.protocol == "0-9-1" and conn.spec is spec091  # auto: RabbitMQ 3.x takes 0-9-1's header
        assert conn.server_properties["product"] == "RabbitMQ"
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.queue_declare(other, durable=True)
        ch.queue_bind(queue, "amq.direct", queue)
        ch.queue_unbind(queue, "amq.direct", queue)  # 0-9-1's own queue.unbind (0-8's is RabbitMQ's)
        ch.publish_many(("", queue, b"m%d" % i, BasicProperties(message_id=f"id{i}", delivery_mode=2))
                        for i in range(2000))
        deadline = time.monotonic() + 10  # RabbitMQ enqueues what it took asynchronously
        while ch.queue_declare(queue, passive=True).message_count < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ch.queue_declare(queue, passive=True).message_count == 2000

        params = pika.URLParameters(rabbitmq.url("amqp"))
        with pika.BlockingConnection(params) as pc:
            pch = pc.channel()
            got = []
            for _method, props, body in pch.consume(queue, inactivity_timeout=5):
                if body is None:
                    break
                got.append((body, props.message_id))
                pch.basic_ack(_method.delivery_tag)
                if len(got) == 2000:
                    break
            pch.cancel()
            assert got == [(b"m%d" % i, f"id{i}") for i in range(2000)]
            for i in range(500):
                pch.basic_publish("", other, b"p%d" % i, pika.BasicProperties(headers={"n": i}))

        # a consumer with an arguments table (0-9-1 has one; RabbitMQ's 0-8 basic.consume has not)
        ch.basic_qos(prefetch_count=100)
        tag = ch.basic_consume(other, arguments={"x-priority": 5})
        bodies = []
        while len(bodies) < 500:
            msg = ch.next_message(timeout=10)
            bodies.append((msg.body, msg.properties.headers["n"]))
            ch.basic_ack(msg.delivery_tag)
        ch.basic_cancel(tag)
        assert bodies == [(b"p%d" % i, i) for i in range(500)]

        ch.basic_publish("", other, b"again")
        msg = ch.basic_get(other, no_ack=False)
        ch.basic_reject(msg.delivery_tag, requeue=True)
        msg = ch.basic_get(other, no_ack=False)
        assert msg.body == b"again" and msg.redelivered
        ch.basic_recover(requeue=True)  # 0-9-1's synchronous recover (110/111)
        with pytest.raises(AMQPChannelError, match="404"):
            ch.queue_declare(unique_name("absent"), passive=True)
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.queue_delete(other)


def test_0_8_stays_what_it_was_and_an_unknown_protocol_is_refused(rabbitmq):
    with Connection.from_url(rabbitmq.url("amqp"), protocol="0-8") as conn:
        assert conn.protocol == "0-8" and conn.dialect == "rabbitmq"
        assert conn.methods.BasicConsume.__name__ == "RabbitBasicConsume"  # no arguments table in 0-8
    with pytest.raises(LocalProtocolError, match="protocol must be one of 0-8, 0-9-1, auto"):
        Connection.from_url(rabbitmq.url("amqp"), protocol="1.0")


@pytest.mark.parametrize("broker", ["rabbitmq", "rabbitmq4"])
def test_publisher_confirms_answer_every_message(request, unique_name, broker):
    """confirm.select, 5,000 persistent messages pipelined, wait_for_confirms: every one answered by the
    broker (RabbitMQ 3.10 and 4; a quorum queue on 4); a 0-8 channel refuses confirm mode, naming why."""
    node = request.getfixturevalue(broker)
    queue = unique_name("confirm")
    with Connection.from_url(node.url("amqp"), protocol="0-9-1") as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True,
                         arguments={"x-queue-type": "quorum"} if broker == "rabbitmq4" else None)
        ch.confirm_select()
        ch.publish_many(("", queue, b"c%d" % i, BasicProperties(delivery_mode=2)) for i in range(5000))
        ch.wait_for_confirms(timeout=60)
        assert ch.unconfirmed == 0 and ch._confirmed == 5000
        ch.basic_publish("", queue, b"one more", BasicProperties(delivery_mode=2))
        ch.wait_for_confirms(timeout=30)
        assert ch.queue_declare(queue, passive=True).message_count == 5001
        ch.queue_delete(queue)
    if broker == "rabbitmq":
        with Connection.from_url(node.url("amqp"), protocol="0-8") as conn:
            with pytest.raises(LocalProtocolError, match="publisher confirms need AMQP 0-9-1"):
                conn.channel().confirm_select()
