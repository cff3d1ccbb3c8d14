"""bench sources: its rows (a format on each broker it supports) and ``--only``."""

from bench.bench_sources import COUNTS, format_of, only_formats, peer_table, protocol_table


def test_stomp_is_measured_on_both_brokers_with_a_peer():
    table = protocol_table("amqp://x", "stomp://rabbit", "tcp://mlm", "stomp://activemq")
    assert set(table) == {"amqp08", "stomp", "stomp-activemq", "malamute"} <= set(COUNTS)
    peers = peer_table("amqp://x", "stomp://rabbit", "stomp://activemq")
    assert {row: name for row, (name, _) in peers.items()} == {
        "amqp08": "pika", "stomp": "stomp.py", "stomp-activemq": "stomp.py"}
    assert table["stomp-activemq"][2]("q")["uri"] == "stomp://activemq"
    assert "stomp-activemq" not in protocol_table("amqp://x", "stomp://rabbit", "tcp://mlm")


def test_only_selects_a_format_on_every_broker_or_one_row():
    table = dict.fromkeys(["amqp08", "stomp", "stomp-activemq", "malamute"])
    assert list(only_formats(table, "stomp")) == ["stomp", "stomp-activemq"]
    assert list(only_formats(table, "stomp-activemq")) == ["stomp-activemq"]
    assert list(only_formats(table, "amqp08,malamute")) == ["amqp08", "malamute"]
    assert list(only_formats(table, None)) == list(table)
    assert [format_of(r) for r in table] == ["amqp08", "stomp", "stomp", "malamute"]
