"""Registration of the three formats with a SparkSession, and the table of their DataSource classes.

Responsible for: naming where each format's ``DataSource`` class lives (``FORMATS``), loading it
(``data_source_class``), and ``register(spark)``, the explicit registration for sessions where the
automatic one does not happen (a zip on ``--py-files``, a notebook that installed the wheel after the
JVM started, Spark Connect clients). Not responsible for the data sources themselves
(``spark_mq.datasources``) nor for automatic registration (the top-level ``pyspark_<format>`` modules,
which use ``data_source_class``).

    import spark_mq
    spark_mq.register(spark)                  # all three formats
    spark_mq.register(spark, ["malamute"])    # or some

``spark_mq.register`` is a plain function of the package (``spark_mq/__init__.py``) that imports this
module when called. Importing this module does not import pyspark.
"""

from __future__ import annotations

import importlib
import os
import shutil
from typing import Iterable, Optional

__all__ = ["FORMATS", "data_source_class", "register", "expose_py_files_to_streaming_sources",
           "redact_uri_options", "with_uri_redaction"]

#: format name -> (module, class) of its DataSource
FORMATS = {
    "amqp08": ("spark_mq.datasources", "Amqp08DataSource"),
    "stomp": ("spark_mq.datasources", "StompDataSource"),
    "malamute": ("spark_mq.datasources", "MalamuteDataSource"),
}


def data_source_class(fmt: str) -> type:
    """The ``DataSource`` subclass of format ``fmt`` (imports pyspark and the format's modules)."""
    try:
        module_name, class_name = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown spark-mq format {fmt!r}; known: {', '.join(FORMATS)}") from None
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    name = cls.name()
    if name != fmt:
        raise TypeError(f"{module_name}.{class_name}.name() is {name!r}, expected {fmt!r}")
    return cls


def register(spark, formats: Optional[Iterable[str]] = None) -> list:
    """Register the formats (default: all three) with ``spark``; returns the names registered.

    Works with classic sessions and Spark Connect sessions alike (``spark.dataSource.register``).
    Registering again is harmless, in any order with the automatic registration: Spark 4.1+ replaces
    the earlier registration; Spark 4.0 refuses a name that exists (``DATA_SOURCE_ALREADY_EXISTS``),
    and since the name is then already this package's format (registered automatically or by an
    earlier call), that refusal counts as done.
    """
    from spark_mq.compat import is_already_registered

    names = list(FORMATS) if formats is None else [formats] if isinstance(formats, str) else list(formats)
    classes = [data_source_class(n) for n in names]  # every import error before any registration
    for cls in classes:
        try:
            spark.dataSource.register(cls)
        except Exception as exc:  # noqa: BLE001 - only Spark 4.0's "already exists" is tolerated
            if not is_already_registered(exc):
                raise
    expose_py_files_to_streaming_sources(spark)
    redact_uri_options(spark)
    return names


#: Spark SQL's option-name redaction regex (``explain()``, the UI's plans), and what it gains here
REDACTION_CONF = "spark.sql.redaction.options.regex"
URI_REDACTION = "(?i:^uri$)"
SPARK_DEFAULT_REDACTION = "(?i)url"  # Spark's default for REDACTION_CONF


def with_uri_redaction(current: Optional[str]) -> str:
    """``current`` (a REDACTION_CONF regex) extended to match the option name ``uri`` too."""
    return f"(?:{current})|{URI_REDACTION}" if current else URI_REDACTION


def redact_uri_options(spark) -> Optional[str]:
    """Have ``spark`` hide the value of every option named ``uri`` in its query plans, where a
    password inside a broker URI would otherwise be shown: Spark prints a source's options in its
    plans and redacts only those whose name matches ``spark.sql.redaction.options.regex`` (default
    ``(?i)url``, for JDBC) or whose name or value matches ``spark.redaction.regex`` (``password`` is
    covered, ``uri`` is not). Extends the session's regex by ``(?i:^uri$)``; returns the new regex,
    or None when it already had it or the session does not let it be set."""
    try:
        current = spark.conf.get(REDACTION_CONF)
    except Exception:  # noqa: BLE001 - a session without the setting (or a closed one): nothing to extend
        return None
    if current and URI_REDACTION in current:
        return None
    regex = with_uri_redaction(current)
    try:
        spark.conf.set(REDACTION_CONF, regex)
    except Exception:  # noqa: BLE001 - a locked-down session: the docs say how to set it by hand
        return None
    return regex


#: The SparkFiles subdirectory that pyspark 4.x's driver-side streaming source process uses as its
#: files directory (hard-coded in PythonStreamingSourceRunner: ``writeSparkFiles(Some("streaming_job"), ...)``).
STREAMING_FILES_DIR = "streaming_job"


def expose_py_files_to_streaming_sources(spark) -> list:
    """Make ``--py-files`` / ``addPyFile`` archives importable by streaming sources; returns what it linked.

    Spark (4.0-4.3 at least) starts the driver-side Python process of a streaming data source with
    its files directory set to ``<SparkFiles root>/streaming_job`` and the job's Python includes
    looked up there, but the files themselves are only in the root: ``readStream.format(...)`` then
    fails with ``No module named 'spark_mq'`` when spark_mq came in a ``--py-files`` zip. Linking
    (or copying) each include into that directory fixes it. A no-op for Spark Connect sessions and
    when nothing is missing. The other fix is to put the zip on ``PYTHONPATH`` of the driver JVM.
    """
    try:
        sc = spark.sparkContext
        from pyspark import SparkFiles
        root = SparkFiles.getRootDirectory()
    except Exception:  # noqa: BLE001 - Spark Connect sessions have no SparkContext here
        return []
    includes = list(getattr(sc, "_python_includes", None) or ())
    target = os.path.join(root, STREAMING_FILES_DIR)
    linked = []
    for name in includes:
        src, dst = os.path.join(root, name), os.path.join(target, name)
        if not os.path.exists(src) or os.path.exists(dst):
            continue
        os.makedirs(target, exist_ok=True)
        try:
            os.symlink(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        linked.append(name)
    return linked
