"""Compatibility: the former path of the ``stomp`` source, kept for users' imports.

``StompDataSource`` now lives in ``spark_mq.datasources`` and the ``stomp`` source's pieces
(``StompConsumer``, ``connect_consumer``, ``validate``, ...) in ``spark_mq.sources.formats.stomp``;
``from spark_mq.sources.stomp import StompDataSource`` (or any of those names) still works through the
module ``__getattr__`` below, which imports them on first use. Nothing in spark_mq imports this module
(tests/unit/test_repository.py checks it), so its one import up a layer makes no circle.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "StompDataSource":
        from spark_mq.datasources import StompDataSource
        return StompDataSource
    if not name.startswith("__"):
        from spark_mq.sources.formats import stomp
        try:
            return getattr(stomp, name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
