"""Writes the notebooks of this directory from the cell texts below (``python notebooks/generate.py``).

Responsible for: the quickstart notebook of each broker family and the Databricks/EMR notebook,
kept as plain Python here so that they are reviewed like code; tests/unit/test_docs_fresh.py fails
when a committed .ipynb differs from what this script writes, and tests/integration/test_notebooks.py
executes every notebook (nbclient) against local Spark and the harness brokers.

Every notebook reads its broker URI from an environment variable (SPARK_MQ_AMQP_URI,
SPARK_MQ_STOMP_URI, SPARK_MQ_MALAMUTE_URI) or falls back to a local default, so it runs unchanged on
a laptop, in CI and (after editing the first cell) on a cluster.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

SPARK_CELL = '''\
import os, sys, time, uuid
# Python workers run $PYSPARK_PYTHON (else "python3"): use this kernel's interpreter locally.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[2]").appName("spark-mq quickstart")
         .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

import spark_mq
# After `pip install` of the wheel (`./dev dist`) the formats are registered automatically;
# registering explicitly is harmless and also covers editable installs and --py-files zips.
spark_mq.register(spark)
RUN = uuid.uuid4().hex[:6]   # unique names, so the notebook can run again against the same broker'''


def _wait_cell(query: str, table: str, n: str) -> str:
    return f'''\
deadline = time.monotonic() + 120
while time.monotonic() < deadline and {query}.exception() is None:
    count = spark.sql("select count(*) from {table}").first()[0]
    if count >= {n}:
        break
    time.sleep(1)
assert {query}.exception() is None, {query}.exception()
spark.sql("select * from {table}").show(5, truncate=False)
print("rows:", count)
assert count >= {n}'''


NOTEBOOKS = {
    "quickstart_malamute.ipynb": [
        ("md", "# spark-mq quickstart: Malamute\n\nMalamute is a ZeroMQ broker; spark-mq ships a wire-compatible "
               "one, so this notebook needs nothing else: it starts the broker inside the kernel unless "
               "`SPARK_MQ_MALAMUTE_URI` names one (`tcp://host:9999`). Malamute has no acknowledgements: the "
               "source log (`logLocation`) is what makes a stream replayable."),
        ("code", '''\
import os
URI = os.environ.get("SPARK_MQ_MALAMUTE_URI")
broker = None
if not URI:
    from spark_mq.malamute_broker import Broker
    broker = Broker(["tcp://127.0.0.1:0"]).start()   # port 0: any free port
    URI = broker.endpoints[0]
print("broker:", URI)'''),
        ("code", SPARK_CELL),
        ("md", "## Batch: write rows to a mailbox, read them back\n\nA mailbox keeps messages until its owner "
               "reads them. The sink takes a `body` column (and optionally `subject`, `address`, `tracker`)."),
        ("code", '''\
MAILBOX = f"quickstart-{RUN}"
(spark.range(10).selectExpr("concat('hello ', cast(id as string)) as body", "'greeting' as subject")
 .write.format("malamute").option("uri", URI).option("mailbox", MAILBOX).mode("append").save())

df = (spark.read.format("malamute").option("uri", URI).option("mailbox", MAILBOX)
      .option("maxMessages", 10).option("readTimeout", "30s").load())
rows = df.selectExpr("cast(body as string) as body", "subject", "sender").collect()
print(rows[:3])
assert sorted(r.body for r in rows) == sorted(f"hello {i}" for i in range(10))'''),
        ("md", "## Streaming: consume a stream into a table\n\n`stream` + `pattern` (a subject regular "
               "expression) select the messages; `logLocation` must be a directory every executor can read."),
        ("code", '''\
import tempfile
work = tempfile.mkdtemp(prefix="spark-mq-nb-")
STREAM = f"sensors-{RUN}"
readings = (spark.readStream.format("malamute").option("uri", URI).option("stream", STREAM)
            .option("pattern", "^temp").option("logLocation", f"{work}/log").load()
            .selectExpr("subject", "cast(body as string) as value", "timestamp"))
query = (readings.writeStream.format("memory").queryName("readings")
         .option("checkpointLocation", f"{work}/checkpoint").trigger(processingTime="1 second").start())'''),
        ("code", '''\
from spark_mq.clients.malamute import MalamuteClient
producer = MalamuteClient(URI, f"sensor-{RUN}")
producer.set_producer(STREAM)
# streams keep nothing for absent readers: send until the query has seen some
deadline = time.monotonic() + 120
i = 0
while time.monotonic() < deadline and spark.sql("select count(*) from readings").first()[0] < 20:
    for _ in range(10):
        producer.send("temp.kitchen" if i % 2 else "humidity.kitchen", f"{20 + i % 5}")
        i += 1
    time.sleep(0.5)
producer.close()'''),
        ("code", _wait_cell("query", "readings", "20") + '''
assert spark.sql("select count(*) from readings where subject not like 'temp%'").first()[0] == 0'''),
        ("code", '''\
query.stop()
spark.stop()
if broker is not None:
    broker.stop()'''),
    ],
    "quickstart_amqp08.ipynb": [
        ("md", "# spark-mq quickstart: AMQP 0-8 (RabbitMQ)\n\nSet `SPARK_MQ_AMQP_URI` "
               "(`amqp://user:pass@host:5672/vhost`, `amqps://` for TLS); the default is a local RabbitMQ with "
               "the guest account. RabbitMQ speaks AMQP 0-8 on its usual port."),
        ("code", '''\
import os
URI = os.environ.get("SPARK_MQ_AMQP_URI", "amqp://guest:guest@127.0.0.1:5672/%2F")'''),
        ("code", SPARK_CELL),
        ("md", "## Batch: publish rows, read them back\n\nThe sink publishes to `exchange` (default: the "
               "default exchange) with `routingKey`; with the default exchange the routing key is the queue. "
               "Here the source declares the queue first (`declare=create`)."),
        ("code", '''\
QUEUE = f"quickstart.orders.{RUN}"
# declare=create declares the queue (durable); the batch read then finds nothing yet
spark.read.format("amqp08").option("uri", URI).option("queue", QUEUE).option("declare", "create") \\
    .option("maxMessages", 1).option("readTimeout", "2s").load().count()

(spark.range(10).selectExpr("to_json(named_struct('order', id, 'amount', id * 10)) as body",
                             "'application/json' as content_type")
 .write.format("amqp08").option("uri", URI).option("routingKey", QUEUE).mode("append").save())

df = (spark.read.format("amqp08").option("uri", URI).option("queue", QUEUE)
      .option("maxMessages", 10).option("readTimeout", "30s").load())
df.selectExpr("cast(body as string) as body", "content_type", "routing_key", "redelivered").show(3, truncate=False)
assert df.count() == 10'''),
        ("md", "## Streaming with acknowledgements\n\n`ackMode` decides when RabbitMQ is acknowledged: "
               "`durable` (default: once the messages are fsynced in the source log), `commit` (when Spark "
               "commits the batch, in a transaction) or `auto` (at-most-once). See docs/guarantees.md."),
        ("code", '''\
import tempfile
work = tempfile.mkdtemp(prefix="spark-mq-nb-")
events = (spark.readStream.format("amqp08").option("uri", URI).option("queue", QUEUE)
          .option("ackMode", "durable").option("logLocation", f"{work}/log").load()
          .selectExpr("cast(body as string) as body", "message_id", "timestamp"))
query = (events.writeStream.format("memory").queryName("orders")
         .option("checkpointLocation", f"{work}/checkpoint").trigger(processingTime="1 second").start())

from spark_mq.clients.amqp08 import Connection
with Connection.from_url(URI) as conn:
    ch = conn.channel()
    ch.tx_select()
    for i in range(25):
        ch.basic_publish("", QUEUE, f'{{"order": {100 + i}}}'.encode())
    ch.tx_commit()'''),
        ("code", _wait_cell("query", "orders", "25")),
        ("code", '''\
query.stop()
with Connection.from_url(URI) as conn:
    conn.channel().queue_delete(QUEUE)
spark.stop()'''),
    ],
    "quickstart_stomp.ipynb": [
        ("md", "# spark-mq quickstart: STOMP 1.0 (ActiveMQ, RabbitMQ's STOMP plugin)\n\nSet "
               "`SPARK_MQ_STOMP_URI` (`stomp://user:pass@host:61613`, `stomp+ssl://` for TLS); the default is "
               "a local broker on 61613. Destinations are broker paths such as `/queue/orders` or "
               "`/topic/prices`."),
        ("code", '''\
import os
URI = os.environ.get("SPARK_MQ_STOMP_URI", "stomp://127.0.0.1:61613")'''),
        ("code", SPARK_CELL),
        ("md", "## Batch: send rows, read them back\n\nThe sink sends each partition inside one STOMP "
               "transaction; a `headers` map column becomes message headers."),
        ("code", '''\
DEST = f"/queue/quickstart.{RUN}"
(spark.range(10).selectExpr("concat('event ', cast(id as string)) as body",
                             "map('region', if(id % 2 = 0, 'eu', 'us')) as headers")
 .write.format("stomp").option("uri", URI).option("destination", DEST).mode("append").save())

df = (spark.read.format("stomp").option("uri", URI).option("destination", DEST)
      .option("maxMessages", 10).option("readTimeout", "30s").load())
rows = df.selectExpr("cast(body as string) as body", "headers['region'] as region").collect()
print(rows[:3])
assert sorted(r.body for r in rows) == sorted(f"event {i}" for i in range(10))
assert {r.region for r in rows} == {"eu", "us"}'''),
        ("md", "## Streaming"),
        ("code", '''\
import tempfile
work = tempfile.mkdtemp(prefix="spark-mq-nb-")
events = (spark.readStream.format("stomp").option("uri", URI).option("destination", DEST)
          .option("logLocation", f"{work}/log").load()
          .selectExpr("cast(body as string) as body", "destination", "message_id"))
query = (events.writeStream.format("memory").queryName("events")
         .option("checkpointLocation", f"{work}/checkpoint").trigger(processingTime="1 second").start())

from spark_mq.clients.stomp import StompClient
with StompClient.from_uri(URI) as client:
    for i in range(25):
        client.send(DEST, f"live {i}".encode())
    client.flush()'''),
        ("code", _wait_cell("query", "events", "25")),
        ("code", '''\
query.stop()
spark.stop()'''),
    ],
    "databricks_emr.ipynb": [
        ("md", "# spark-mq on Databricks and EMR\n\n"
               "spark-mq is pure Python (plus pyzmq for Malamute and pyarrow, which Spark images have). "
               "`--packages` resolves JVM artifacts only; Python packages are installed like this:\n\n"
               "spark-mq is not on PyPI yet: `./dev dist` builds the wheel, "
               "`spark_mq-<version>-py3-none-any.whl`.\n\n"
               "* **Databricks**: `%pip install "
               "/Volumes/<catalog>/<schema>/<volume>/spark_mq-<version>-py3-none-any.whl` in the notebook "
               "(or the wheel as a cluster library). The notebook's Python environment is the one "
               "Spark's Python workers use.\n"
               "* **EMR** (and EMR Serverless): a bootstrap action that copies the wheel from S3 and runs "
               "`sudo pip3 install spark_mq-<version>-py3-none-any.whl`, or pack a virtual environment "
               "(`venv-pack -o env.tar.gz`) and pass `--archives env.tar.gz#env` with "
               "`spark.pyspark.python=./env/bin/python`.\n"
               "* **any cluster**: `spark-submit --py-files spark_mq-<version>-py-files.zip job.py` "
               "(from `./dev dist`), with pyarrow and (for Malamute) pyzmq installed on the nodes, and "
               "`spark_mq.register(spark)` in the job: zips on `--py-files` are not auto-registered.\n\n"
               "Put `logLocation` on storage every executor reads (`/Volumes/...`, `/dbfs/...`, `s3://...`; not "
               "`dbfs:/...`, which pyarrow cannot open), "
               "one directory per query (this notebook: `SPARK_MQ_BASE`; without it a local temporary directory, "
               "which only works in local mode), and keep credentials in a secret scope, not in the notebook. "
               "Outside Databricks/EMR this notebook runs against local Spark and an embedded Malamute "
               "broker, which is how the test suite executes it."),
        ("code", '''\
# Databricks: uncomment on first use (restarts Python)
# %pip install /Volumes/<catalog>/<schema>/<volume>/spark_mq-<version>-py3-none-any.whl
import os, sys, tempfile, time, uuid
ON_DATABRICKS = "DATABRICKS_RUNTIME_VERSION" in os.environ
ON_EMR = os.path.exists("/emr/instance-controller")
print("Databricks:", ON_DATABRICKS, "EMR:", ON_EMR)'''),
        ("code", '''\
from pyspark.sql import SparkSession
if "spark" not in globals():            # Databricks and EMR notebooks define `spark` already
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("spark-mq databricks/emr")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
import spark_mq
print("registered:", spark_mq.register(spark), "on Spark", spark.version)'''),
        ("code", '''\
# Where the broker is. On a cluster: a reachable broker and a secret, for example
#   URI = dbutils.secrets.get("brokers", "malamute-uri")        # tcp://host:9999
URI = os.environ.get("SPARK_MQ_MALAMUTE_URI")
broker = None
if not URI:
    from spark_mq.malamute_broker import Broker
    broker = Broker(["tcp://127.0.0.1:0"]).start()
    URI = broker.endpoints[0]
# Shared storage for the source log and the checkpoint, e.g. "/dbfs/spark-mq/orders" or "s3://bucket/spark-mq"
BASE = os.environ.get("SPARK_MQ_BASE")
if not BASE:
    if ON_DATABRICKS or ON_EMR:  # a driver-local directory: executors on other nodes could not read the log
        raise RuntimeError("set SPARK_MQ_BASE to storage every executor reads (/Volumes/..., s3://...)")
    BASE = tempfile.mkdtemp(prefix="spark-mq-nb-")
RUN = uuid.uuid4().hex[:6]
print("broker:", URI.split("@")[-1], "storage:", BASE)'''),
        ("code", '''\
STREAM = f"clicks-{RUN}"
clicks = (spark.readStream.format("malamute").option("uri", URI).option("stream", STREAM)
          .option("logLocation", f"{BASE}/{RUN}/log").load())
counts = clicks.groupBy("subject").count()
query = (counts.writeStream.format("memory").queryName("clicks").outputMode("complete")
         .option("checkpointLocation", f"{BASE}/{RUN}/checkpoint").trigger(processingTime="2 seconds").start())

from spark_mq.clients.malamute import MalamuteClient
producer = MalamuteClient(URI, f"web-{RUN}")
producer.set_producer(STREAM)
deadline = time.monotonic() + 120
while time.monotonic() < deadline and query.exception() is None:
    for page in ("home", "cart", "checkout"):
        producer.send(page, b"{}")
    total = spark.sql("select coalesce(sum(count), 0) from clicks").first()[0]
    if total >= 30:
        break
    time.sleep(0.3)
producer.close()
assert query.exception() is None, query.exception()
spark.sql("select * from clicks order by subject").show()
assert total >= 30'''),
        ("code", '''\
query.stop()
if broker is not None:
    broker.stop()
if not (ON_DATABRICKS or ON_EMR):
    spark.stop()'''),
    ],
}


def build(name: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, (kind, text) in enumerate(NOTEBOOKS[name]):
        cell = nbformat.v4.new_markdown_cell(text) if kind == "md" else nbformat.v4.new_code_cell(text)
        cell["id"] = f"{Path(name).stem.replace('_', '-')}-{i}"
        nb.cells.append(cell)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def main() -> int:
    for name in NOTEBOOKS:
        (HERE / name).write_text(render(name))
        print("wrote", HERE / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
