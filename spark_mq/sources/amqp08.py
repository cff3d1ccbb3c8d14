"""Compatibility: the former path of the ``amqp08`` source, kept for users' imports.

``Amqp08DataSource`` now lives in ``spark_mq.datasources`` and the ``amqp08`` source's pieces
(``Amqp08Consumer``, ``connect_consumer``, ``validate``, ...) in ``spark_mq.sources.formats.amqp08``;
``from spark_mq.sources.amqp08 import Amqp08DataSource`` (or any of those names) still works through the
module ``__getattr__`` below, which imports them on first use. Nothing in spark_mq imports this module
(tests/unit/test_repository.py checks it), so its one import up a layer makes no circle.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "Amqp08DataSource":
        from spark_mq.datasources import Amqp08DataSource
        return Amqp08DataSource
    if not name.startswith("__"):
        from spark_mq.sources.formats import amqp08
        try:
            return getattr(amqp08, name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
