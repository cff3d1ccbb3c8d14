"""The Spark ``DataSource`` of each format: its source and its sink under one format name.

Responsible for: ``Amqp08DataSource``, ``StompDataSource`` and ``MalamuteDataSource``, which Spark
registers under ``amqp08``, ``stomp`` and ``malamute`` (see ``spark_mq.register``): reads go to the
format's source (``spark_mq.sources``, the format's own pieces in ``spark_mq.sources.formats``), writes
to its sink (``spark_mq.sinks``). This module stands above both, so neither imports the other. Not
responsible for reading or writing anything itself.

    from spark_mq.datasources import Amqp08DataSource
    spark.dataSource.register(Amqp08DataSource)

The classes lived in ``spark_mq.sources.<format>`` before; those names still work: that module is
now a compatibility shim whose module ``__getattr__`` imports them from here on first use (the one
import that runs up a layer). Nothing in spark_mq imports the shims, so they make no circle.

Spark starts a fresh Python process for each call it makes on a data source (lookup, create, plan,
commit) and for each task's worker, and each imports this module: so it imports only pyspark's
``DataSource``, and a format's source or sink modules are imported when a read or a write first needs
them (``_Module``): a stream read of amqp08 never imports the STOMP and Malamute code, nor a sink.
"""

from __future__ import annotations

import importlib

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader

__all__ = ["MQDataSource", "Amqp08DataSource", "StompDataSource", "MalamuteDataSource"]


class _Module:
    """A class attribute that is the module named ``name``, imported on first access."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return importlib.import_module(self.name)


class MQDataSource(DataSource):
    """Base of the per-format DataSources: subclasses set ``FORMAT``, ``SOURCE`` (the format's module
    in ``spark_mq.sources.formats``: ``validate``, ``connect_consumer``, ``queue_depth``) and ``SINK`` (its module in
    ``spark_mq.sinks``: ``create_writer``, ``create_stream_writer``)."""

    FORMAT = ""
    SOURCE = None
    SINK = None

    @classmethod
    def name(cls) -> str:
        return cls.FORMAT

    def _source_options(self, streaming: bool):
        from spark_mq.sources.base import source_options

        return source_options(self.FORMAT, self.options, self.SOURCE.validate, streaming)

    def schema(self) -> str:
        from spark_mq import schema as S

        self._source_options(streaming=False)  # unknown or contradictory options fail at load()
        return S.source_ddl(self.FORMAT)

    def streamReader(self, schema) -> DataSourceStreamReader:
        opts = self._source_options(streaming=True)
        if opts.get("ingest") == "executors":
            from spark_mq.sources.executors import EXECUTOR_STREAM_READER

            return EXECUTOR_STREAM_READER(self.FORMAT, opts, schema, self.SOURCE.connect_consumer,
                                          self.SOURCE.queue_depth)
        from spark_mq.sources.base import STREAM_READER

        return STREAM_READER(self.FORMAT, opts, schema, self.SOURCE.connect_consumer)

    def reader(self, schema) -> DataSourceReader:
        from spark_mq.sources.base import MQBatchReader

        return MQBatchReader(self.FORMAT, self._source_options(streaming=False), schema, self.SOURCE.connect_consumer)

    def writer(self, schema, overwrite: bool):
        return self.SINK.create_writer(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        return self.SINK.create_stream_writer(self.options, schema, overwrite)


class Amqp08DataSource(MQDataSource):
    """``format("amqp08")``: AMQP 0-8 (RabbitMQ)."""

    FORMAT = "amqp08"
    SOURCE = _Module("spark_mq.sources.formats.amqp08")
    SINK = _Module("spark_mq.sinks.amqp08")


class StompDataSource(MQDataSource):
    """``format("stomp")``: STOMP 1.0 (RabbitMQ, ActiveMQ)."""

    FORMAT = "stomp"
    SOURCE = _Module("spark_mq.sources.formats.stomp")
    SINK = _Module("spark_mq.sinks.stomp")


class MalamuteDataSource(MQDataSource):
    """``format("malamute")``: Malamute."""

    FORMAT = "malamute"
    SOURCE = _Module("spark_mq.sources.formats.malamute")
    SINK = _Module("spark_mq.sinks.malamute")
