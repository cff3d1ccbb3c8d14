"""Synchronous Malamute clients: two drivers around the sans-IO ``ClientConnection``.

The API follows the reference C client (mlm_client): ``MalamuteClient(endpoint, address, timeout)``
connects; ``set_producer`` / ``send`` (streams), ``set_consumer`` / ``remove_consumer``, ``sendto``
(mailboxes), ``set_worker`` / ``sendfor`` (services), ``recv``, ``credit``, ``ping``, ``close``.

This module is the facade; the drivers live apart, as they share nothing but the protocol:

- ``MalamuteClient`` (``malamute_pyzmq``): a pyzmq DEALER with an IO thread of its own, safe from
  any thread; ``recv`` also returns a CONFIRM from the server (``Confirm``: ``tracker``, ``code``,
  ``reason``), which the reference broker never sends.
- ``MalamuteReceiver`` and ``Deliveries`` (``malamute_receiver``): no IO thread, driven by the one
  thread that consumes, over the repository's own ZMTP 3.0 DEALER (``spark_mq.transport.zmtp``)
  instead of pyzmq; the Malamute source's reader uses it. It hands a CONFIRM to ``on_event``
  instead: what it returns are deliveries only.
- what both share (status properties, reply checks, connection events): ``malamute_base``.

Received messages are the codec's ``StreamDeliver``, ``MailboxDeliver``, ``ServiceDeliver`` objects:
``sender``, ``address``, ``subject``, ``tracker``, ``content`` (list of bytes).
"""

from spark_mq.clients.malamute_pyzmq import Body, MalamuteClient
from spark_mq.clients.malamute_receiver import DEFAULT_READ_BUFFER, Deliveries, MalamuteReceiver

__all__ = ["MalamuteClient", "MalamuteReceiver", "Deliveries", "DEFAULT_READ_BUFFER", "Body"]
