"""A class-data-sharing archive of Spark's classes for the test suite's Spark drivers (issue 56).

The suite starts a Spark driver about 150 times (subprocess drivers, the in-process sessions, the version
matrix's releases, notebooks' kernels, Spark Connect servers), and it is bound by its 2 cores: most of a
short-lived JVM's CPU goes into loading and linking the ~13,000 classes a Spark session and a streaming
query need. A dynamic CDS archive (JDK 13+, ``-XX:ArchiveClassesAtExit``) made once from a representative
job maps them from a file instead: a session, a small aggregation and a Python UDF took 13.5-14.5 CPU
seconds without it and 10.0-10.5 with it (measured in pairs on this machine; wall 12 s -> 8.5 s).

One archive per (java, pyspark installation, JVM options), cached under ``~/.cache/spark-mq/jvm-cds``
(``SPARK_MQ_CACHE`` moves it). The JVM checks an archive against its class path and its own build, and
when it does not match (another JDK, another ``SPARK_CONF_DIR``, a changed jars folder) it loads the
classes as usual: an archive can make a driver slower to start never wrong, and its warnings are off.

Two constraints shape how the tests use it (tests/conftest.py):
- the JVM refuses a class path holding a non-empty directory: Spark puts ``SPARK_CONF_DIR`` first on its
  class path, so the tests give their Spark settings as ``-Dspark.*`` system properties (which SparkConf
  reads like spark-defaults.conf) and leave ``SPARK_CONF_DIR`` unset (pip's pyspark has no conf folder);
- ``spark-submit`` first runs a small launcher JVM with another class path: the archive goes into
  ``SPARK_SUBMIT_OPTS``, which only the driver's JVM gets (a Connect server started with spark-submit too).

    python scripts/jvm_archive.py make PYTHON...   # make the archive of each venv's pyspark (./dev does)
    python scripts/jvm_archive.py show PYTHON      # the options a driver of that venv gets

Standard library only; the archive job itself runs in the given venv.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

# The JVM options of every test JVM (tests/conftest.py puts them in JDK_JAVA_OPTIONS): the archive is made
# with them, since some (the collector) must match for the JVM to use it. Why each: see tests/conftest.py.
JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions "
                "-XX:-BytecodeVerificationRemote -XX:-UsePerfData")
# An archive that does not match is skipped with a warning on stdout (the JVM's unified logging): off
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# What the archive job runs: the classes a test driver loads. A Spark session, DataFrame and SQL work with
# a shuffle, a Python UDF, a Python data source read in batch and as a stream (micro-batches into the
# memory and parquet sinks, a checkpoint, availableNow), and a Python data source writer.
JOB = r'''
import os, sys, tempfile
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter, InputPartition, WriterCommitMessage

class Reader(DataSourceReader):
    def read(self, partition):
        for i in range(100):
            yield (f"m-{i}".encode(), i)

class StreamReader(DataSourceStreamReader):
    def initialOffset(self):
        return {"n": 0}
    def latestOffset(self, *args):
        return {"n": 300}
    def partitions(self, start, end):
        return [InputPartition((start["n"], end["n"]))]
    def read(self, partition):
        lo, hi = partition.value
        for i in range(lo, hi):
            yield (f"m-{i}".encode(), i)
    def commit(self, end):
        pass

class Writer(DataSourceWriter):
    def write(self, rows):
        return WriterCommitMessage()

class Source(DataSource):
    @classmethod
    def name(cls):
        return "cds_archive_job"
    def schema(self):
        return "body binary, n long"
    def reader(self, schema):
        return Reader()
    def streamReader(self, schema):
        return StreamReader()
    def writer(self, schema, overwrite):
        return Writer()

work = tempfile.mkdtemp(prefix="spark-mq-cds-")
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.dataSource.register(Source)
spark.range(20000).select((F.col("id") % 7).alias("k")).groupBy("k").count().collect()
spark.range(10).select(F.udf(lambda x: x + 1, "long")("id")).collect()
df = spark.read.format("cds_archive_job").load()
df.select(F.col("body").cast("string")).collect()
df.write.format("cds_archive_job").mode("append").save()
spark.createDataFrame([(1, "a")], "n long, s string").write.parquet(work + "/p")
spark.read.parquet(work + "/p").count()
q = (spark.readStream.format("cds_archive_job").load().select(F.col("body").cast("string").alias("b"))
     .writeStream.format("memory").queryName("cds_job").option("checkpointLocation", work + "/c1")
     .trigger(availableNow=True).start())
q.awaitTermination(300)
q = (spark.readStream.format("cds_archive_job").load().writeStream.format("parquet").option("path", work + "/o")
     .option("checkpointLocation", work + "/c2").trigger(availableNow=True).start())
q.awaitTermination(300)
spark.table("cds_job").count()
proc = spark.sparkContext._gateway.proc  # the driver's JVM (spark-submit execs into it)
spark.stop()
proc.stdin.close()  # the JVM exits when its stdin closes, and writes the archive as it exits
proc.wait(300)
'''


def _cache() -> Path:
    base = os.environ.get("SPARK_MQ_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "spark-mq")
    return Path(base) / "jvm-cds"


def java_identity() -> str:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    try:
        done = subprocess.run([java, "-Xshare:auto", "-version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, env=_env_without_java_options())
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stderr


def _env_without_java_options() -> dict:
    env = dict(os.environ)
    for k in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS", "SPARK_SUBMIT_OPTS"):
        env.pop(k, None)
    return env


def _pyspark_dir(python: Path) -> Optional[Path]:
    site = sorted((Path(python).resolve().parent.parent / "lib").glob("python3*/site-packages/pyspark"))
    if site:
        return site[0]
    # a python outside a venv (or another layout): ask it
    try:
        done = subprocess.run([str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


def archive_path(python: Path, java: Optional[str] = None) -> Optional[Path]:
    """Where the archive of ``python``'s pyspark lives (whether or not it exists yet); None without pyspark.
    ``java``: what ``java -version`` says (asked when not given).
    The key holds everything the JVM checks: the JDK build, the jars (names and sizes), the options."""
    pyspark = _pyspark_dir(python)
    if pyspark is None or not (pyspark / "jars").is_dir():
        return None
    h = hashlib.sha256()
    h.update((java if java is not None else java_identity()).encode())
    h.update(str(pyspark.resolve()).encode())
    for jar in sorted((pyspark / "jars").iterdir()):
        h.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    h.update(JAVA_OPTIONS.encode())
    return _cache() / f"spark-{h.hexdigest()[:20]}.jsa"


#: archives kept in the cache (each checkout's venvs have their own: the JVM checks the jars' paths)
KEEP = 8


def _prune(cache: Path, keep: int) -> None:
    """Remove all but the ``keep`` archives made or used last (their logs too)."""
    archives = sorted(cache.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[keep:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".log").unlink(missing_ok=True)


def submit_options(archive: Optional[Path]) -> str:
    """What ``SPARK_SUBMIT_OPTS`` carries for a driver to use ``archive`` ("" when there is none)."""
    if archive is None or not archive.is_file():
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"


def make(python: Path, log=print) -> Optional[Path]:
    """The archive of ``python``'s pyspark, made when missing (about 30 s). None when it cannot be made:
    the tests then run without it, only slower."""
    python = Path(os.path.abspath(python))  # the job runs in a folder of its own
    archive = archive_path(python)
    if archive is None:
        log(f"[spark-mq] no pyspark in {python}: no JVM class archive")
        return None
    if archive.is_file():
        os.utime(archive)  # in use: the last to be pruned
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    _prune(archive.parent, KEEP - 1)
    for stale in archive.parent.glob(archive.name + ".*.partial"):  # a make that was stopped midway
        if not Path(f"/proc/{stale.name.split('.')[-2]}").exists():
            stale.unlink(missing_ok=True)
    partial = archive.with_name(archive.name + f".{os.getpid()}.partial")
    env = _env_without_java_options()
    env.pop("SPARK_CONF_DIR", None)  # the tests' drivers run without one too (see the module docstring)
    env["JDK_JAVA_OPTIONS"] = JAVA_OPTIONS
    env["SPARK_SUBMIT_OPTS"] = f"-XX:ArchiveClassesAtExit={partial} {QUIET}"
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spark-mq-cds-") as cwd, \
            open(archive.with_suffix(".log"), "w") as out:
        done = subprocess.run([str(python), "-c", JOB], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=900)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        log(f"[spark-mq] could not make the JVM class archive of {python} (see {archive.with_suffix('.log')}): "
            "the tests run without it")
        return None
    partial.replace(archive)
    log(f"[spark-mq] JVM class archive of {python.parent.parent.name}'s pyspark: {archive} "
        f"({archive.stat().st_size / 2**20:.0f} MiB, {time.monotonic() - started:.0f} s)")
    return archive


def main(argv) -> int:
    if len(argv) >= 2 and argv[0] == "make":
        for python in argv[1:]:
            make(Path(python), log=lambda m: print(m, file=sys.stderr))
        return 0
    if len(argv) == 2 and argv[0] == "show":
        print(submit_options(archive_path(Path(argv[1]))))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
