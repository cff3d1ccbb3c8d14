"""The main job: an end-to-end streaming pipeline through a message broker, self-checking.

Responsible for: starting the embedded Malamute broker in-process (unless ``--uri`` names another
broker), producing realistic order events (JSON, event times slightly out of order), running a
Spark query that reads them with ``readStream.format(<protocol>)``, aggregates orders and revenue per
region in event-time tumbling windows with a watermark, and writes each finalized window back to the
broker with ``writeStream.format(<protocol>)``; reading those results back, showing live progress
(messages/s, Spark batches, backlog from ``lastProgress``), and ending with a summary that checks
every finalized window against the producer's own tally. Not responsible for any protocol or Spark
data source logic: it only uses the public clients and formats.

    python -m spark_mq.apps.demo                    # embedded Malamute broker, 60 s
    python -m spark_mq.apps.demo --seconds 20 --rate 1000
    python -m spark_mq.apps.demo --uri amqp://guest:guest@127.0.0.1:5672/%2F
    python -m spark_mq.apps.demo --uri stomp://127.0.0.1:61613
    spark-mq demo ...                               # the same

Exit status 0 when every finalized window matches the tally, 1 otherwise (or on failure).

How the pipeline ends cleanly: windows are emitted (append mode) only once the watermark passes
them, and the watermark only moves with new events. When the producer stops, it sends one
end-of-stream marker (quantity 0) whose event time lies beyond the last window plus the watermark
delay; the query drops its group after the aggregation (``items > 0``: Spark would push a filter on
the region below the watermark), but it moves the watermark, so Spark's next (no-data) batch
emits every remaining window.

Modules: ``job`` (the arguments and one run), ``orders`` (the events, the producer, its tally),
``backends`` (the per-protocol plumbing), ``query`` (Spark settings, session and query), ``report``
(the live progress line and the summary).
"""

from spark_mq.apps.demo.job import main
from spark_mq.apps.demo.orders import EOS_REGION, PRODUCTS, REGIONS, Tally, make_order
from spark_mq.apps.demo.query import LOG4J2, SPARK_DEFAULTS, spark_settings

__all__ = ["main", "Tally", "make_order", "REGIONS", "PRODUCTS", "EOS_REGION", "SPARK_DEFAULTS", "LOG4J2",
           "spark_settings"]
