"""Publisher confirms' bookkeeping in the AMQP client channel (pure code: the broker's basic.ack/basic.nack
as the connection hands them over, single and multiple, in and out of order)."""

from types import SimpleNamespace

from spark_mq.clients.amqp08_channel import Channel
from spark_mq.protocol.amqp08 import spec091


def _channel(published: int) -> Channel:
    ch = Channel(SimpleNamespace(), 1)
    ch.confirming, ch._published = True, published
    return ch


def test_acks_single_multiple_and_out_of_order_add_up():
    ch = _channel(10)
    ch._on_confirm(spec091.BasicAck(delivery_tag=3, multiple=True))
    assert (ch._confirmed, ch.unconfirmed) == (3, 7)
    ch._on_confirm(spec091.BasicAck(delivery_tag=5, multiple=False))  # 4 not yet
    assert (ch._confirmed, ch.unconfirmed) == (3, 6)
    ch._on_confirm(spec091.BasicAck(delivery_tag=4, multiple=False))  # fills the gap: 4 and 5 done
    assert (ch._confirmed, ch.unconfirmed) == (5, 5)
    ch._on_confirm(spec091.BasicAck(delivery_tag=10, multiple=True))
    assert (ch._confirmed, ch.unconfirmed, ch._nacked) == (10, 0, [])


def test_nacks_are_recorded_once_each_and_count_as_answered():
    ch = _channel(8)
    ch._on_confirm(spec091.BasicAck(delivery_tag=2, multiple=False))
    ch._on_confirm(spec091.BasicNack(delivery_tag=3, multiple=True, requeue=False))  # 1 and 3, not 2
    assert ch._nacked == [1, 3] and ch._confirmed == 3
    ch._on_confirm(spec091.BasicNack(delivery_tag=6, multiple=False, requeue=False))
    ch._on_confirm(spec091.BasicAck(delivery_tag=8, multiple=True))
    assert ch._nacked == [1, 3, 6] and ch.unconfirmed == 0
