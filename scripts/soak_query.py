"""The streaming query of one soak case, run by scripts/soak.py as a child process (its own process
group, so that a SIGKILL of the group is a real crash of driver, JVM and Python workers).

    python scripts/soak_query.py CONFIG.json

Reads ``format`` with ``options`` from the config and writes every micro-batch with foreachBatch
into ``out`` as one file per batch id (``batch-<id>.txt``, one body per line), written to a
temporary file, fsynced and renamed over: a batch Spark replays after a crash replaces its own
file, so the sink is idempotent and every duplicate left in ``out`` is one the source produced.
Runs until killed, or until the file ``stop`` appears (then stops the query cleanly).
"""

from __future__ import annotations

import json
import os
import sys

CONFIG = json.loads(open(sys.argv[1]).read())
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

import spark_mq  # noqa: E402


def main() -> None:
    # local[2,4]: a task is tried up to 4 times (Spark's fixed 10 s wait for a new Python worker can
    # pass on a busy 2-core machine, see tests/integration/matrix_job.py)
    spark = (SparkSession.builder.master("local[2,4]").appName("spark-mq-soak")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.python.authenticate.socketTimeout", "120s")
             .getOrCreate())
    spark_mq.register(spark)
    out = CONFIG["out"]

    def write_batch(df, batch_id: int) -> None:
        bodies = [r[0] for r in df.selectExpr("cast(body as string)").collect()]
        final = os.path.join(out, f"batch-{batch_id:09d}.txt")
        tmp = os.path.join(out, f".batch-{batch_id:09d}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(b + "\n" for b in bodies))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)

    query = (spark.readStream.format(CONFIG["format"]).options(**CONFIG["options"]).load()
             .writeStream.foreachBatch(write_batch).option("checkpointLocation", CONFIG["checkpoint"])
             .trigger(processingTime="200 milliseconds").start())
    print("STARTED", flush=True)
    while not query.awaitTermination(1):
        if os.path.exists(CONFIG["stop"]):
            query.stop()
            break
    error = query.exception()
    spark.stop()
    if error is not None:
        print(f"QUERY FAILED: {error}", flush=True)
        sys.exit(1)
    print("STOPPED", flush=True)


if __name__ == "__main__":
    main()
