r"""What differs between STOMP 1.0 brokers, as data, and how to tell which one we talk to.

Measured against RabbitMQ 3.10 (rabbitmq_stomp) and ActiveMQ 5.17 (see docs/stomp.md and
tests/integration/test_stomp_brokers.py, which re-measures each fact on every run):

- ``ack:client`` is cumulative on both: ACK of message N acknowledges every earlier unacked
  message of that subscription. With several subscriptions on one connection they differ:
  ActiveMQ stops at the subscription, RabbitMQ (one AMQP channel per STOMP connection, ACK as
  ``basic.ack multiple``) acknowledges the earlier messages of every subscription, and then
  refuses an ACK of one of those as an unknown delivery tag. ACKs of each subscription's last
  message, sent in delivery order, are right on both (``spark_mq.sources.formats.stomp``).
- each bounds unacknowledged deliveries with its own SUBSCRIBE header and ignores the other's.
- a transaction left open at DISCONNECT is rolled back by both: its SENDs are dropped and its
  ACKs undone (the messages are redelivered).
- neither keeps 1.0's "no escaping": both read ``\\``, ``\c`` and ``\n`` escapes in the header
  values we send (RabbitMQ drops the connection on any other backslash sequence), so a value
  with a backslash must be sent escaped; RabbitMQ also escapes the values of the MESSAGE frames
  it sends (a ``:`` arrives as ``\c``), ActiveMQ sends them raw.  Both trim leading white space
  of values, ActiveMQ trailing white space too.
- RabbitMQ holds back the RECEIPT of a SEND or ACK made in a transaction until the COMMIT (sent
  after the COMMIT's own receipt) and never sends it if the transaction is aborted; ActiveMQ
  answers at once.  So a client must not wait for such a receipt before committing.

A broker we do not recognise gets the safe profile: per-message ACKs (correct on a cumulative
broker too, as long as they go out in delivery order) and every prefetch header we know.

It must not do IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Tuple

from spark_mq.protocol.stomp10._constants import Header


@dataclass(frozen=True)
class BrokerProfile:
    name: str
    #: ACK of one message in ``ack:client`` mode also acknowledges all earlier ones.
    cumulative_client_ack: bool
    #: SUBSCRIBE headers that bound unacknowledged deliveries (all get the same number).
    prefetch_headers: Tuple[str, ...]
    #: What the broker does with a transaction still open at DISCONNECT (for docs and checks).
    open_transaction_at_disconnect: str
    #: The broker reads 1.1-style escapes in header values we send (so we escape backslashes).
    unescapes_sent_headers: bool = False
    #: The broker escapes header values of the frames it sends (so we unescape them).
    escapes_received_headers: bool = False
    #: Receipts of frames in a transaction come only at COMMIT (and never after ABORT).
    defers_transaction_receipts: bool = True


RABBITMQ = BrokerProfile(
    "rabbitmq", True, (Header.RABBITMQ_PREFETCH,), "rolled back", unescapes_sent_headers=True, escapes_received_headers=True
)
ACTIVEMQ = BrokerProfile(
    "activemq", True, (Header.ACTIVEMQ_PREFETCH,), "rolled back", unescapes_sent_headers=True, defers_transaction_receipts=False
)
UNKNOWN = BrokerProfile("unknown", False, (Header.RABBITMQ_PREFETCH, Header.ACTIVEMQ_PREFETCH), "unknown")

_BY_SERVER_PREFIX = (("rabbitmq/", RABBITMQ), ("activemq/", ACTIVEMQ))


def detect_broker(connected_headers: Mapping[str, str]) -> BrokerProfile:
    """The profile for the ``server`` header of a CONNECTED frame (``UNKNOWN`` if absent)."""
    server = connected_headers.get(Header.SERVER, "").lower()
    for prefix, profile in _BY_SERVER_PREFIX:
        if server.startswith(prefix):
            return profile
    return UNKNOWN
