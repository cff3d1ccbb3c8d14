"""The demo's Spark side: its settings (``SPARK_DEFAULTS``, the quiet log4j2 configuration), its
session, and the streaming query (event-time windows per region with a watermark, from the source
format into the sink format of the same broker)."""

from __future__ import annotations

import os
import sys
import time

from spark_mq.apps.demo.backends import Backend
from spark_mq.apps.demo.orders import ORDER_SCHEMA
from spark_mq.registration import REDACTION_CONF, SPARK_DEFAULT_REDACTION, with_uri_redaction

__all__ = ["SPARK_DEFAULTS", "LOG4J2", "spark_settings", "start_spark", "build_query", "wait_idle",
           "wait_for_first_batch"]

#: Spark settings of the demo; conf/spark/spark-defaults.conf holds the same (a unit test checks it) as
#: recommended defaults for spark-mq pipelines.
SPARK_DEFAULTS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark's default extended by uri, as spark_mq.register does: a password inside a broker URI stays
    # out of query plans also where the formats register themselves and nothing calls register
    REDACTION_CONF: with_uri_redaction(SPARK_DEFAULT_REDACTION),
}
#: log4j2 configuration of the demo's JVM; conf/logging/log4j2.properties is the same file.
LOG4J2 = """\
# spark-mq: quiet Spark logging for streaming jobs (used by the demo; pass it with
#   --conf spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:conf/logging/log4j2.properties).
# Errors from Spark, warnings from the Python data source machinery, everything else off.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.pyds.name = org.apache.spark.sql.execution.datasources.v2.python
logger.pyds.level = warn
"""


def spark_settings(workdir: str) -> dict:
    """The demo's Spark settings: ``SPARK_DEFAULTS`` (what conf/spark/spark-defaults.conf recommends),
    no UI, and the quiet log4j2 configuration (written into ``workdir``)."""
    log_conf = os.path.join(workdir, "log4j2.properties")
    with open(log_conf, "w") as fh:
        fh.write(LOG4J2)
    return {**SPARK_DEFAULTS, "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log_conf}"}


def start_spark(master: str, workdir: str):
    from pyspark.sql import SparkSession
    # Python workers (and the lookup of auto-registered formats) run $PYSPARK_PYTHON, else "python3",
    # which may lack pyarrow/spark_mq: use this interpreter unless the user chose one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName("spark-mq demo")
    for key, value in spark_settings(workdir).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_idle(query, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)


def wait_for_first_batch(query, timeout: float) -> None:
    """The source subscribes when Spark plans the first batch: streams keep nothing for absent readers."""
    deadline = time.monotonic() + timeout
    while query.lastProgress is None:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Spark batch within {timeout:.0f}s")
        time.sleep(0.2)


def build_query(spark, backend: Backend, workdir: str, window_s: int, watermark_s: int, trigger_s: float):
    from pyspark.sql import functions as F

    raw = (spark.readStream.format(backend.fmt).options(**backend.source_options())
           .option("logLocation", os.path.join(workdir, "source-log")).load())
    orders = (raw.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
              .withColumn("event_time", F.timestamp_millis("ts_ms")))
    windows = (orders.withWatermark("event_time", f"{watermark_s} seconds")
               .groupBy(F.window("event_time", f"{window_s} seconds"), "region")
               .agg(F.count(F.lit(1)).alias("orders"), F.sum(F.col("quantity") * F.col("price_cents")).alias("revenue_cents"),
                    F.sum("quantity").alias("items")))
    # Drop the marker's own group by an aggregate (its quantity is 0): a filter on the region column
    # would be pushed below the aggregation and the watermark, and the marker could not move it.
    results = (windows.where(F.col("items") > 0)
               .select(F.to_json(F.struct(
                   (F.unix_micros(F.col("window.start")) / 1000).cast("long").alias("window_start_ms"),
                   (F.unix_micros(F.col("window.end")) / 1000).cast("long").alias("window_end_ms"),
                   "region", "orders", "items", "revenue_cents")).alias("body")))
    if backend.fmt == "malamute":
        results = results.withColumn("subject", F.get_json_object("body", "$.region"))
    return (results.writeStream.format(backend.fmt).options(**backend.sink_options())
            .outputMode("append").option("checkpointLocation", os.path.join(workdir, "checkpoint"))
            .trigger(processingTime=f"{trigger_s} seconds").start())
