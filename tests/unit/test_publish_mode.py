"""The amqp08 sink's publishMode: which commit a connection gets (issue 57). On brokers:
tests/integration/test_rabbitmq4.py."""

from __future__ import annotations

import pytest

from spark_mq.errors import OptionError
from spark_mq.sinks.amqp08 import publish_mode
from spark_mq.sinks.options import parse_sink_options


def _opts(**extra):
    return parse_sink_options({"uri": "amqp://guest:guest@127.0.0.1:5672/%2F", "routingKey": "q", **extra}, "amqp08")


@pytest.mark.parametrize("protocol", ["0-9-1", "0-8"])
def test_transactions_are_the_default_on_either_protocol(protocol):
    assert _opts().get("publishMode") == "tx"
    assert publish_mode(_opts(), protocol) == "tx"


def test_confirms_on_0_9_1_when_asked():
    assert publish_mode(_opts(publishMode="confirm"), "0-9-1") == "confirm"


def test_tx_is_kept_on_either_protocol():
    assert publish_mode(_opts(publishMode="tx"), "0-9-1") == "tx"
    assert publish_mode(_opts(publishMode="tx"), "0-8") == "tx"


def test_confirm_on_0_8_names_both_options():
    with pytest.raises(OptionError) as info:
        publish_mode(_opts(publishMode="confirm"), "0-8")
    assert "publishMode=confirm" in str(info.value) and "option protocol" in str(info.value)


def test_an_unknown_mode_is_refused_naming_the_option():
    with pytest.raises(OptionError) as info:
        _opts(publishMode="two-phase")
    assert "publishMode" in str(info.value)
