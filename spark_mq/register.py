"""Registration of the three formats with a SparkSession, and the table of their DataSource classes.

Responsible for: naming where each format's ``DataSource`` class lives (``FORMATS``), loading it
(``data_source_class``), and ``register(spark)``, the explicit registration for sessions where the
automatic one does not happen (a zip on ``--py-files``, a notebook that installed the wheel after the
JVM started, Spark Connect clients). Not responsible for the data sources themselves
(``spark_mq.sources``) nor for automatic registration (the top-level ``pyspark_<format>`` modules,
which use ``data_source_class``).

    import spark_mq
    spark_mq.register(spark)                  # all three formats
    spark_mq.register(spark, ["malamute"])    # or some

``spark_mq.register`` is both this module and the function: the module object is callable, so the
call works whichever of ``import spark_mq.register`` or ``spark_mq.register(...)`` happened first.
Importing this module does not import pyspark.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Iterable, Optional

__all__ = ["FORMATS", "data_source_class", "register"]

#: format name -> (module, class) of its DataSource
FORMATS = {
    "amqp08": ("spark_mq.sources.amqp08", "Amqp08DataSource"),
    "stomp": ("spark_mq.sources.stomp", "StompDataSource"),
    "malamute": ("spark_mq.sources.malamute", "MalamuteDataSource"),
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
    Registering again is harmless: the later registration replaces the earlier one.
    """
    names = list(FORMATS) if formats is None else [formats] if isinstance(formats, str) else list(formats)
    classes = [data_source_class(n) for n in names]  # every import error before any registration
    for cls in classes:
        spark.dataSource.register(cls)
    return names


class _CallableModule(types.ModuleType):
    """Lets ``spark_mq.register(spark)`` work after ``import spark_mq.register`` bound the module there."""

    def __call__(self, spark, formats: Optional[Iterable[str]] = None) -> list:
        return register(spark, formats)


sys.modules[__name__].__class__ = _CallableModule
