"""An embeddable Malamute broker, wire-compatible with zeromq/malamute (see docs/malamute.md).

``Broker(endpoints=[...]).start()`` / ``stop()`` or ``with Broker(...) as broker:`` runs it in a
thread; ``python -m spark_mq.malamute_broker --endpoint tcp://127.0.0.1:9999`` runs it as a process.
The routing logic is the sans-IO ``core.BrokerCore``; ``server`` is the thin ZeroMQ shell.
"""

from spark_mq.malamute_broker.core import BrokerCore, Limits
from spark_mq.malamute_broker.server import DEFAULT_ENDPOINT, Broker, serve

__all__ = ["Broker", "BrokerCore", "DEFAULT_ENDPOINT", "Limits", "serve"]
