"""Packaging as users meet it, in a fresh virtual environment (no system site packages, nothing of this
checkout on the path):

- ``spark-submit --py-files spark_mq-...-py-files.zip job.py`` with pyspark's own ``spark-submit``, in
  an environment where spark_mq is NOT installed: the job registers the formats and runs a streaming
  query from a Malamute stream to a Malamute stream (source, source log and sink all from the zip).
- then ``pip install <wheel>`` into the same venv: the three formats resolve with no register call
  (the ``pyspark_<format>`` modules), ``spark_mq.register(spark)`` works too, importing spark_mq
  does not import pyspark, and the ``spark-mq`` script is installed.

The wheel and zip come from ``scripts/build_dist.py`` (what ``./dev dist`` runs). The dependencies
(pyspark, pyarrow, pyzmq, numpy, pinned to the versions of the running environment) come from the pip
cache or PyPI.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT = 900
JOB_TIMEOUT = 400
FORMATS = ("amqp08", "stomp", "malamute")
#: the --py-files job's test helper (stream_round_trip), not part of the package: shipped with --py-files too
BROKER_PROCESS = Path(__file__).resolve().parent / "broker_process.py"

pytestmark = [pytest.mark.timeout(1800),
              pytest.mark.xdist_group("test_packaging")]  # one xdist worker: shared state (tests/conftest.py)


def _build_dist_module():
    spec = importlib.util.spec_from_file_location("build_dist", ROOT / "scripts" / "build_dist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_env(venv: Path) -> dict:
    """The environment of a process in ``venv`` that knows nothing of this checkout or its venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME",
                        "PYTHONHOME", "PYTHONSTARTUP")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PYSPARK_PYTHON"] = str(venv / "bin" / "python")
    env["PYTHONUNBUFFERED"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(cmd, *, env, cwd, timeout, what):
    try:
        result = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, timeout=timeout,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{what} did not finish within {timeout}s:\n{(exc.stderr or b'')[-4000:].decode()}")
    if result.returncode != 0:
        raise AssertionError(f"{what} failed (exit {result.returncode}):\nstdout:\n{result.stdout.decode()[-4000:]}"
                             f"\nstderr:\n{result.stderr.decode(errors='replace')[-6000:]}")
    return result


def _requirements() -> list:
    return [f"{name}=={importlib.metadata.version(name)}" for name in ("pyspark", "pyarrow", "pyzmq", "numpy")]


def _make_venv(path: Path, packages: list) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300, stdin=subprocess.DEVNULL)
    env = _clean_env(path)
    _run([path / "bin" / "python", "-m", "pip", "install", "-q", *packages], env=env, cwd=path,
         timeout=PIP_TIMEOUT, what=f"pip install {' '.join(map(str, packages))} (needs PyPI or the pip cache)")
    cfg = (path / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    return path


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("dist")
    return _build_dist_module().build(out)


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A fresh venv with pyspark, pyarrow, pyzmq and numpy, but no spark_mq."""
    return _make_venv(tmp_path_factory.mktemp("venv") / "venv", _requirements())


@pytest.fixture(scope="module")
def installed_venv(bare_venv, dist) -> Path:
    """The same venv after ``pip install <wheel>`` (pip checks the wheel's dependencies against it).

    It reuses bare_venv to save a second 700 MB environment: the --py-files test, which needs
    spark_mq absent, comes first in this file and checks that it is absent."""
    env = _clean_env(bare_venv)
    _run([bare_venv / "bin" / "python", "-m", "pip", "install", "-q", dist["wheel"]], env=env, cwd=bare_venv,
         timeout=PIP_TIMEOUT, what="pip install <wheel>")
    return bare_venv


def test_wheel_and_zip_contents(dist, tmp_path):
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        entry_points = next(whl.read(n).decode() for n in names if n.endswith("entry_points.txt"))
        metadata = next(whl.read(n).decode() for n in names if n.endswith("METADATA"))
    for fmt in FORMATS:
        assert f"pyspark_{fmt}.py" in names
    assert "spark_mq/registration.py" in names and "spark_mq/apps/cli.py" in names
    assert not any("tests/" in n or "__pycache__" in n for n in names)
    # the test helpers (tests/integration/sinktest.py, broker_process.py) stay out of what users install
    assert not [n for n in names if Path(n).stem in ("testing", "sinktest", "broker_process")], sorted(names)
    assert "spark-mq = spark_mq.apps.cli:main" in entry_points
    for dep in ("pyspark", "pyarrow", "pyzmq", "numpy"):
        assert f"Requires-Dist: {dep}" in metadata
    with zipfile.ZipFile(dist["zip"]) as zf:
        znames = set(zf.namelist())
    assert {f"pyspark_{fmt}.py" for fmt in FORMATS} <= znames
    assert "spark_mq/__init__.py" in znames and "spark_mq/clients/connect.py" in znames
    assert all(n.endswith(".py") for n in znames)
    assert not [n for n in znames if Path(n).stem in ("testing", "sinktest", "broker_process")], sorted(znames)
    # reproducible: building again gives the same bytes
    again = _build_dist_module().build_zip(tmp_path)
    assert again.read_bytes() == Path(dist["zip"]).read_bytes()


PY_FILES_JOB = r'''
import json, os, sys, tempfile, threading, time
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("py-files").getOrCreate()
import spark_mq
report = {"spark_mq": spark_mq.__file__}

# --py-files zips are not scanned for pyspark_* modules: before register() the format is unknown.
try:
    spark.read.format("malamute").option("uri", "tcp://127.0.0.1:1").option("stream", "s").load()
    report["before_register"] = "resolved"
except Exception as exc:
    report["before_register"] = "DATA_SOURCE_NOT_FOUND" if "DATA_SOURCE_NOT_FOUND" in str(exc) else str(exc)[:500]
report["registered"] = spark_mq.register(spark)
from pyspark import SparkFiles
report["linked_for_streaming"] = sorted(os.listdir(os.path.join(SparkFiles.getRootDirectory(), "streaming_job")))

from spark_mq.clients.malamute import MalamuteClient
from spark_mq.malamute_broker import Broker
broker = Broker(["tcp://127.0.0.1:0"]).start()
endpoint = broker.endpoints[0]
work = tempfile.mkdtemp(prefix="py-files-job-")
consumer = MalamuteClient(endpoint, "checker")
consumer.set_consumer("out", "")

query = (spark.readStream.format("malamute").option("uri", endpoint).option("stream", "in")
         .option("logLocation", os.path.join(work, "log")).load()
         .selectExpr("upper(cast(body as string)) as body", "subject")
         .writeStream.format("malamute").option("uri", endpoint).option("stream", "out")
         .option("checkpointLocation", os.path.join(work, "checkpoint"))
         .trigger(processingTime="500 milliseconds").start())

from broker_process import stream_round_trip
report.update(stream_round_trip(endpoint, consumer, query, 20, subject="reading"))
query.stop()
consumer.close()
broker.stop()
spark.stop()
print("REPORT " + json.dumps(report))
'''


def test_spark_submit_py_files_without_spark_mq_installed(bare_venv, dist, tmp_path):
    env = _clean_env(bare_venv)
    py = bare_venv / "bin" / "python"
    probe = subprocess.run([py, "-c", "import spark_mq"], env=env, cwd=tmp_path, capture_output=True, timeout=60)
    assert probe.returncode != 0 and b"No module named 'spark_mq'" in probe.stderr
    job = tmp_path / "job.py"
    job.write_text(PY_FILES_JOB)
    spark_submit = bare_venv / "bin" / "spark-submit"
    assert spark_submit.exists(), "pyspark's spark-submit script is missing from the venv"
    result = _run([spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                   "--conf", "spark.sql.shuffle.partitions=1", "--py-files", f"{dist['zip']},{BROKER_PROCESS}", job],
                  env=env, cwd=tmp_path, timeout=JOB_TIMEOUT, what="spark-submit --py-files")
    line = next(ln for ln in result.stdout.decode().splitlines() if ln.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    assert ".zip/spark_mq/__init__.py" in report["spark_mq"], report["spark_mq"]
    assert report["before_register"] == "DATA_SOURCE_NOT_FOUND"
    assert report["registered"] == list(FORMATS)
    # Spark looks up the streaming source's includes in <SparkFiles root>/streaming_job: register() links them
    # (the zip; a .py on --py-files is not one of pyspark's includes, and only the driver imports it)
    assert report["linked_for_streaming"] == [Path(dist["zip"]).name]
    assert report["query_exception"] is None
    numbers = sorted(int(body[1:]) for body in report["received"])
    assert all(body.startswith("M") for body in report["received"])  # went through the query's upper()
    assert len(numbers) >= 20
    # from the first message the source saw to the last one sent: no gap, no duplicate
    assert numbers == list(range(numbers[0], report["last_sent"] + 1)), numbers


INSTALLED_CHECK = r'''
import json, sys, time, warnings
warnings.simplefilter("error", RuntimeWarning)   # a pyspark_* module that could not load its format warns
import spark_mq
report = {"spark_mq": spark_mq.__file__, "pyspark_imported_by_spark_mq": "pyspark" in sys.modules}
import pyspark_amqp08, pyspark_stomp, pyspark_malamute
report["default_sources"] = {m.__name__: [m.DefaultSource.name(), repr(m.IMPORT_ERROR)]
                             for m in (pyspark_amqp08, pyspark_stomp, pyspark_malamute)}

from pyspark.sql import SparkSession
from spark_mq.clients.malamute import MalamuteClient
from spark_mq.malamute_broker import Broker

spark = (SparkSession.builder.master("local[1]").appName("packaging")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
broker = Broker(["tcp://127.0.0.1:0"]).start()
endpoint = broker.endpoints[0]

# No register call: the formats must resolve (schemas come from spark-mq's DataSources).
schemas = {}
for fmt, opts in (("amqp08", {"uri": "amqp://127.0.0.1:1/", "queue": "q"}),
                  ("stomp", {"uri": "stomp://127.0.0.1:1", "destination": "/queue/q"}),
                  ("malamute", {"uri": endpoint, "stream": "s"})):
    schemas[fmt] = spark.read.format(fmt).options(**opts).load().schema.fieldNames()
report["schemas"] = schemas

def write_and_collect(stream, n):
    consumer = MalamuteClient(endpoint, "checker-" + stream)
    consumer.set_consumer(stream, "")
    df = spark.range(n).selectExpr("concat('event-', cast(id as string)) as body")
    df.write.format("malamute").option("uri", endpoint).option("stream", stream).mode("append").save()
    got, deadline = [], time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        msg = consumer.recv(1.0)
        if msg is not None:
            got.append(bytes(msg.content[0]).decode())
    consumer.close()
    return sorted(got)

report["auto_written"] = write_and_collect("auto", 5)
report["registered"] = spark_mq.register(spark)
report["register_is_function"] = type(spark_mq.register).__name__ == "function"
report["after_register_written"] = write_and_collect("explicit", 3)
spark.stop()
broker.stop()
print("REPORT " + json.dumps(report))
'''


def test_pip_install_registers_formats_without_a_call(installed_venv, tmp_path):
    env = _clean_env(installed_venv)
    py = installed_venv / "bin" / "python"
    script = tmp_path / "check.py"
    script.write_text(INSTALLED_CHECK)
    result = _run([py, script], env=env, cwd=tmp_path, timeout=JOB_TIMEOUT, what="the installed-wheel check")
    line = next(ln for ln in result.stdout.decode().splitlines() if ln.startswith("REPORT "))
    report = json.loads(line[len("REPORT "):])
    assert report["spark_mq"].startswith(str(installed_venv)), report["spark_mq"]
    assert report["pyspark_imported_by_spark_mq"] is False
    assert report["default_sources"] == {f"pyspark_{f}": [f, "None"] for f in FORMATS}
    for fmt in FORMATS:
        assert {"body", "destination", "message_id", "timestamp", "headers", "offset"} <= set(report["schemas"][fmt])
    assert "frames" in report["schemas"]["malamute"]
    assert report["auto_written"] == [f"event-{i}" for i in range(5)]
    assert report["registered"] == list(FORMATS)
    assert report["register_is_function"] is True
    assert report["after_register_written"] == [f"event-{i}" for i in range(3)]
    # the console script is installed and runs from the venv
    version = _run([installed_venv / "bin" / "spark-mq", "--version"], env=env, cwd=tmp_path, timeout=60,
                   what="spark-mq --version")
    assert version.stdout.decode().startswith("spark-mq ")
