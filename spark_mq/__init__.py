"""spark-mq: Spark Structured Streaming sources and sinks for message brokers.

The package is layered (imports point down only):

1. ``spark_mq.protocol.<proto>``: sans-IO codecs and protocol state machines.
2. ``spark_mq.transport``: IO drivers (blocking sockets with TLS, reader threads, timers).
3. ``spark_mq.clients``: small synchronous client facades.
4. ``spark_mq.sources`` / ``spark_mq.sinks`` / ``spark_mq.malamute_broker``: the Spark Python Data Source
   layer (neither imports the other) and the embedded broker.
5. ``spark_mq.datasources``: each format's ``DataSource``, joining its source and its sink.
6. ``spark_mq.apps``: the applications (the ``spark-mq`` command, the demo, the bridge job).

``tests/unit/test_repository.py`` holds these rules.
"""

from __future__ import annotations

from typing import Iterable, Optional

from spark_mq.errors import SparkMqError

__all__ = ["SparkMqError", "register", "commit_batch_read"]
__version__ = "0.1.0.dev0"


def register(spark, formats: Optional[Iterable[str]] = None) -> list:
    """Register the formats (default: all three) with ``spark``; returns the names registered.

    See ``spark_mq.registration.register``, which this calls; importing spark_mq does not import pyspark."""
    from spark_mq.registration import register as _register

    return _register(spark, formats)


def __getattr__(name: str):
    if name == "commit_batch_read":  # batch reads with logLocation: see spark_mq.sources.batchread
        from spark_mq.sources.batchread import commit_batch_read
        return commit_batch_read
    raise AttributeError(f"module 'spark_mq' has no attribute {name!r}")
