"""Automatic registration of ``format("amqp08")``: pyspark imports every top-level ``pyspark_*`` module
and registers its ``DefaultSource`` under ``DefaultSource.name()``.

This module must import without raising, whatever happens: one failing ``pyspark_*`` module disables
the automatic registration of every format in that JVM. When the data source cannot be loaded, it
defines no ``DefaultSource`` (pyspark then skips it), keeps the reason in ``IMPORT_ERROR`` and
warns; ``spark_mq.register(spark)`` raises the real error.
"""

try:
    from spark_mq.registration import data_source_class as _load

    DefaultSource = _load("amqp08")
    IMPORT_ERROR = None
except Exception as _exc:  # noqa: BLE001 - see the docstring: never fail the import
    IMPORT_ERROR = _exc
    import warnings as _warnings

    _warnings.warn(f"spark-mq: format \"amqp08\" is not available: {type(_exc).__name__}: {_exc}",
                   RuntimeWarning, stacklevel=1)
