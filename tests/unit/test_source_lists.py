"""Several sources of messages per query (issue 45): the options that list them, parsed at ``load()``
with errors naming the option at fault, and the choice of ACKs for several STOMP subscriptions
(``last_of_each_subscription``). The brokers' side is in tests/integration/test_sources_multi.py."""

from __future__ import annotations

import pytest

from spark_mq.errors import OptionError
from spark_mq.protocol.stomp10 import Command, Frame
from spark_mq.sources.base import source_options
from spark_mq.sources.formats import amqp08, malamute, stomp
from spark_mq.sources.formats.stomp import last_of_each_subscription, not_yet_acked

_VALIDATE = {"amqp08": amqp08.validate, "stomp": stomp.validate, "malamute": malamute.validate}
_URI = {"amqp08": "amqp://guest:guest@127.0.0.1:5672/%2F", "stomp": "stomp://127.0.0.1:61613",
        "malamute": "tcp://127.0.0.1:9999"}


def load(fmt: str, **options):
    return source_options(fmt, {"uri": _URI[fmt], **options}, _VALIDATE[fmt], streaming=False)


def test_amqp08_queue_takes_a_comma_separated_list():
    assert amqp08.queues(load("amqp08", queue=" orders , invoices,refunds ")) == ("orders", "invoices", "refunds")
    assert amqp08.queues(load("amqp08", queue="orders")) == ("orders",)


@pytest.mark.parametrize("fmt, option, value, says", [
    ("amqp08", "queue", "orders,,invoices", "an empty queue"),
    ("amqp08", "queue", "orders,", "an empty queue"),
    ("amqp08", "queue", "orders, orders", "queue 'orders' is given twice"),
    ("stomp", "destination", "/queue/a,", "an empty destination"),
    ("stomp", "destination", "/queue/a,/queue/b,/queue/a", "destination '/queue/a' is given twice"),
])
def test_a_list_with_an_empty_or_a_repeated_element_fails_naming_the_option(fmt, option, value, says):
    with pytest.raises(OptionError) as err:
        load(fmt, **{option: value})
    assert f"option {option!r}" in str(err.value) and says in str(err.value)


def test_stomp_destination_takes_a_comma_separated_list():
    assert stomp.destinations(load("stomp", destination="/queue/a, /topic/b")) == ("/queue/a", "/topic/b")


def test_stomp_dead_letter_destination_may_not_be_one_of_the_destinations_read():
    with pytest.raises(OptionError, match="deadLetterDestination"):
        load("stomp", destination="/queue/a,/queue/b", poisonMessages="deadLetter", deadLetterDestination="/queue/b")


def test_malamute_streams_is_a_json_object_of_stream_to_pattern():
    opts = load("malamute", streams='{"weather": "^temp", "alerts": ""}')
    assert malamute.streams(opts) == (("weather", "^temp"), ("alerts", ""))
    assert malamute.streams(load("malamute", stream="weather", pattern="^t")) == (("weather", "^t"),)


@pytest.mark.parametrize("options, says", [
    ({"streams": '["weather"]'}, "option 'streams'"),                  # not an object
    ({"streams": "{weather}"}, "option 'streams'"),                    # not JSON
    ({"streams": '{"weather": 5}'}, "option 'streams': the pattern of stream 'weather'"),
    ({"streams": '{"weather": null}'}, "option 'streams': the pattern of stream 'weather'"),
    ({"streams": "{}"}, "option 'streams' is an empty JSON object"),
    ({"streams": '{" ": ""}'}, "option 'streams': an empty stream name"),
    ({"streams": '{"a": ""}', "stream": "b"}, "options 'stream' and 'streams' contradict each other"),
    ({"streams": '{"a": ""}', "mailbox": "b"}, "options 'mailbox' and 'streams' contradict each other"),
    ({"streams": '{"a": ""}', "pattern": "^x"}, "options 'streams' and 'pattern' contradict each other"),
])
def test_malamute_streams_errors_name_the_option(options, says):
    with pytest.raises(OptionError) as err:
        load("malamute", **options)
    assert says in str(err.value)


def test_malamute_refuses_a_list_of_mailboxes_saying_why():
    with pytest.raises(OptionError) as err:
        load("malamute", mailbox="jobs,other")
    assert "option 'mailbox'" in str(err.value) and "one address" in str(err.value)


def _frame(sub: str, n: int) -> Frame:
    return Frame(Command.MESSAGE, {"subscription": sub, "message-id": f"{sub}-{n}"})


def test_acks_name_the_last_message_of_each_subscription_in_delivery_order():
    frames = [_frame("a", 1), _frame("b", 1), _frame("a", 2), _frame("c", 1), _frame("b", 2), _frame("a", 3)]
    got = [f.headers["message-id"] for f in last_of_each_subscription(frames)]
    # c-1 came before b-2, and b-2 before a-3: each ACK names a message later than all an earlier
    # ACK settled on RabbitMQ (cumulative over the connection), and each subscription gets one (ActiveMQ)
    assert got == ["c-1", "b-2", "a-3"]
    one = [_frame("a", 1), _frame("a", 2)]
    assert last_of_each_subscription(one) == [one[1]]


def test_a_commit_acks_only_the_subscriptions_with_something_new():
    a1, b1, a2 = _frame("a", 1), _frame("b", 1), _frame("a", 2)
    token = ((2, b1), (3, a2))  # the last of each up to a2, in delivery order
    assert not_yet_acked(token, {}) == [(2, b1), (3, a2)]
    assert not_yet_acked(token, {"b": 2}) == [(3, a2)]          # b's last one is acknowledged already
    assert not_yet_acked(token, {"a": 3, "b": 2}) == []         # nothing new: no transaction at all
    assert not_yet_acked(((1, a1),), {"a": 3}) == []            # an older token than what was acked
