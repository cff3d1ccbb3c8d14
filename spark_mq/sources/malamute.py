"""Compatibility: the former path of the ``malamute`` source, kept for users' imports.

``MalamuteDataSource`` now lives in ``spark_mq.datasources`` and the ``malamute`` source's pieces
(``MalamuteConsumer``, ``connect_consumer``, ``validate``, ...) in ``spark_mq.sources.formats.malamute``;
``from spark_mq.sources.malamute import MalamuteDataSource`` (or any of those names) still works through the
module ``__getattr__`` below, which imports them on first use. Nothing in spark_mq imports this module
(tests/unit/test_repository.py checks it), so its one import up a layer makes no circle.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "MalamuteDataSource":
        from spark_mq.datasources import MalamuteDataSource
        return MalamuteDataSource
    if not name.startswith("__"):
        from spark_mq.sources.formats import malamute
        try:
            return getattr(malamute, name)
        except AttributeError:
            pass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
