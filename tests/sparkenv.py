"""The environment of every JVM and Spark driver the tests start (tests/conftest.py applies it at import).

Also imported by tests that start drivers in other virtual environments (the version matrix), which give
each its own ``spark_submit_options``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import jvm_archive  # noqa: E402


# Settings of every Spark driver the tests start (the in-process sessions, the drivers in subprocesses, the
# notebooks' kernels, the version matrix's releases, spark-submit, Spark Connect servers), as system
# properties in SPARK_SUBMIT_OPTS (SparkConf reads ``spark.*`` system properties as it reads
# spark-defaults.conf; a setting a test or its job gives itself wins over these). Not a SPARK_CONF_DIR:
# Spark puts that folder on the JVM's class path, and the JVM's class archive (below) refuses a class path
# with a non-empty folder on it.
SPARK_TEST_CONF = {
    # A Python worker started on a loaded 2-core machine (the suite runs on several xdist workers) can
    # take longer than the 15 s default to connect back; Spark then fails the query ("Python worker failed
    # to connect back"), which is the machine's load, not the connector.
    "spark.python.authenticate.socketTimeout": "120s",
    # No web UI: nothing in the tests looks at it, and each one is a Jetty server started per driver.
    "spark.ui.enabled": "false",
}
# The JVMs of the tests (Spark drivers and their launcher, a standalone cluster's daemons and executors,
# ActiveMQ) live seconds to minutes, mostly starting up: the C1 compiler alone and the serial collector
# take about 40% less CPU to start a Spark session and run a small job than the defaults (22 and 13 CPU
# seconds on this machine), and the suite is bound by its 2 cores. Not verifying the bytecode of the
# classpath's classes (Spark's and the JDK's own jars: nothing the tests load is untrusted) and no
# hsperfdata file take about 10% more off (a session and a small aggregation: 15.2/16.9 -> 13.8/14.2 CPU
# seconds, measured in pairs). Benchmarks and users' JVMs keep the defaults. SPARK_MQ_TEST_JAVA_OPTIONS
# replaces these options ("" for none); the JVM says "Picked up JDK_JAVA_OPTIONS" on its stderr.
JAVA_OPTIONS = jvm_archive.JAVA_OPTIONS
_java_options = os.environ.get("SPARK_MQ_TEST_JAVA_OPTIONS", JAVA_OPTIONS)
# what SPARK_SUBMIT_OPTS held before the tests set it (kept for the drivers of other venvs; xdist's
# workers inherit the controller's environment, hence the copy in the environment)
_BEFORE = "SPARK_MQ_SUBMIT_OPTS_BEFORE_TESTS"
_java_identity: str | None = None


def spark_submit_options(python: Path | str) -> str:
    """SPARK_SUBMIT_OPTS for a Spark driver run by ``python`` (a venv's): the tests' settings, and the class
    archive of that venv's pyspark when ./dev made one (scripts/jvm_archive.py: a driver then takes about a
    quarter less CPU to start; a driver whose class path does not match it loads its classes as usual)."""
    props = " ".join(f"-D{k}={v}" for k, v in SPARK_TEST_CONF.items())
    archive = ""
    if _java_options == JAVA_OPTIONS and os.environ.get("SPARK_MQ_TEST_JVM_ARCHIVE", "1") != "0":
        archive = jvm_archive.submit_options(jvm_archive.archive_path(Path(python), java_identity()))
    return " ".join(x for x in (os.environ.get(_BEFORE, ""), props, archive) if x)


def java_identity() -> str:
    global _java_identity
    if _java_identity is None:
        _java_identity = jvm_archive.java_identity()
    return _java_identity


def apply() -> None:
    """Set the JVM options and this venv's SPARK_SUBMIT_OPTS in this process's environment (children inherit
    it). Spark settings come as system properties: unset SPARK_CONF_DIR is part of it (see SPARK_TEST_CONF)."""
    if _java_options and "JDK_JAVA_OPTIONS" not in os.environ:
        os.environ["JDK_JAVA_OPTIONS"] = _java_options
    # a developer's own Spark configuration is not the tests' (and its folder would cost the archive)
    os.environ.pop("SPARK_CONF_DIR", None)
    if _BEFORE not in os.environ:
        os.environ[_BEFORE] = os.environ.get("SPARK_SUBMIT_OPTS", "")
    os.environ["SPARK_SUBMIT_OPTS"] = spark_submit_options(sys.executable)
