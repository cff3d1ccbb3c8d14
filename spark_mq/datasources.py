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
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader

from spark_mq import schema as S
from spark_mq.options import Options
from spark_mq.sinks import amqp08 as amqp08_sink
from spark_mq.sinks import malamute as malamute_sink
from spark_mq.sinks import stomp as stomp_sink
from spark_mq.sources.base import STREAM_READER, MQBatchReader, source_options
from spark_mq.sources.executors import EXECUTOR_STREAM_READER
from spark_mq.sources.formats import amqp08 as amqp08_source
from spark_mq.sources.formats import malamute as malamute_source
from spark_mq.sources.formats import stomp as stomp_source

__all__ = ["MQDataSource", "Amqp08DataSource", "StompDataSource", "MalamuteDataSource"]


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

    def _source_options(self, streaming: bool) -> Options:
        return source_options(self.FORMAT, self.options, self.SOURCE.validate, streaming)

    def schema(self) -> str:
        self._source_options(streaming=False)  # unknown or contradictory options fail at load()
        return S.source_ddl(self.FORMAT)

    def streamReader(self, schema) -> DataSourceStreamReader:
        opts = self._source_options(streaming=True)
        if opts.get("ingest") == "executors":
            return EXECUTOR_STREAM_READER(self.FORMAT, opts, schema, self.SOURCE.connect_consumer,
                                          self.SOURCE.queue_depth)
        return STREAM_READER(self.FORMAT, opts, schema, self.SOURCE.connect_consumer)

    def reader(self, schema) -> DataSourceReader:
        return MQBatchReader(self.FORMAT, self._source_options(streaming=False), schema, self.SOURCE.connect_consumer)

    def writer(self, schema, overwrite: bool):
        return self.SINK.create_writer(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        return self.SINK.create_stream_writer(self.options, schema, overwrite)


class Amqp08DataSource(MQDataSource):
    """``format("amqp08")``: AMQP 0-8 (RabbitMQ)."""

    FORMAT = "amqp08"
    SOURCE = amqp08_source
    SINK = amqp08_sink


class StompDataSource(MQDataSource):
    """``format("stomp")``: STOMP 1.0 (RabbitMQ, ActiveMQ)."""

    FORMAT = "stomp"
    SOURCE = stomp_source
    SINK = stomp_sink


class MalamuteDataSource(MQDataSource):
    """``format("malamute")``: Malamute."""

    FORMAT = "malamute"
    SOURCE = malamute_source
    SINK = malamute_sink
