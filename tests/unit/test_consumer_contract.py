"""The source's consumer contract: every format's consumer is a ``Consumer`` and can be made (no
abstract method left), and the ingest's optional calls have the base's defaults."""

from __future__ import annotations

import inspect

import pytest

from spark_mq.sources.consumer import Consumer
from spark_mq.sources.formats.amqp08 import Amqp08Consumer
from spark_mq.sources.formats.malamute import MalamuteConsumer
from spark_mq.sources.formats.stomp import StompConsumer

CONSUMERS = [Amqp08Consumer, StompConsumer, MalamuteConsumer]


def test_the_base_names_what_every_format_must_provide():
    assert Consumer.__abstractmethods__ == {"poll", "row", "buffered", "close"}


@pytest.mark.parametrize("cls", CONSUMERS, ids=lambda c: c.__name__)
def test_every_consumer_subclasses_the_base_and_implements_its_abstract_methods(cls):
    assert issubclass(cls, Consumer)
    assert not inspect.isabstract(cls), cls.__abstractmethods__
    for name in Consumer.__abstractmethods__:
        assert getattr(cls, name) is not getattr(Consumer, name), name
    # a consumer that says it can do something provides the method that does it
    if cls.builds_batches:
        assert cls.poll_batch is not Consumer.poll_batch
    if cls.dead_letters:
        assert cls.dead_letter is not Consumer.dead_letter


def test_the_ingest_modules_probe_no_capability_with_getattr():
    import spark_mq.sources.availablenow as availablenow
    import spark_mq.sources.base as base
    import spark_mq.sources.batchread as batchread
    import spark_mq.sources.dedup as dedup
    import spark_mq.sources.ingest as ingest
    import spark_mq.sources.poison as poison
    import spark_mq.sources.progress as progress
    import spark_mq.sources.writebehind as writebehind

    for module in (ingest, availablenow, dedup, poison, progress, writebehind, batchread, base):
        assert "getattr(consumer" not in inspect.getsource(module)
        assert "getattr(self.consumer" not in inspect.getsource(module)


class _Minimal(Consumer):
    def poll(self, max_count, timeout):
        return []

    def row(self, msg, offset, now_us):
        return ()

    def buffered(self):
        return 0

    def close(self):
        pass


def test_the_defaults_do_nothing_and_cannot_tell():
    c = _Minimal()
    assert (c.stable_ids, c.returns_unacked, c.acks_release_more, c.builds_batches, c.dead_letters,
            c.broker_stamps) == (True, True, False, False, False, False)
    assert c.ack([1]) is None and c.token(1) is None and c.ack_commit(None) is None
    assert c.pause() is None and c.resume() is None and c.keepalive() is None
    assert c.depth() is None and c.depth_in_order() is None
    assert c.broker_stamp_ms(1) is None and c.heard_at() is None and c.active_at() is None
    with pytest.raises(NotImplementedError):
        c.poll_batch(1, 0.0, 0)
    with pytest.raises(NotImplementedError):
        c.dead_letter(1, "why", 1)
    with pytest.raises(TypeError):
        Consumer()
