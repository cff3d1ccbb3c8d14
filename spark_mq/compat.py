"""What the running pyspark offers a Python data source, detected once, by capability.

Responsible for: the one place where the differences between pyspark 4.0, 4.1, 4.2 and 4.3 are
looked up (``CAPS``), always by what the installed pyspark has (a class, a method's signature, a
keyword), never by its version string, because vendors backport (Databricks' 4.0-based 17.3 LTS
already runs admission control). Everything else imports the classes and flags from here.
Not responsible for acting on the differences: the stream reader (``sources.base``) applies limits
from options where Spark gives none, the sinks pick the Row or Arrow writer, ``register`` treats an
existing registration as done.

    from spark_mq.compat import CAPS
    CAPS.read_limits          # latestOffset(start, limit), getDefaultReadLimit, reportLatestOffset
    CAPS.available_now        # SupportsTriggerAvailableNow (else availableNow runs one batch)
    CAPS.stream_arrow_writer  # DataSourceStreamArrowWriter (else the Row writer)

``python -m spark_mq.compat`` prints the running pyspark's capabilities as JSON.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import pyspark

try:  # read limits and the availableNow mixin (Apache Spark 4.2, SPARK-55304; some vendors earlier)
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow,
    )
except ImportError:
    ReadAllAvailable = ReadMaxBytes = ReadMaxRows = ReadMinRows = None
    SupportsTriggerAvailableNow = None

try:  # the streaming Arrow writer (Apache Spark 4.1)
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:
    DataSourceStreamArrowWriter = None

__all__ = [
    "CAPS", "Capabilities", "arrow_schema_of", "ReadAllAvailable", "ReadMaxBytes", "ReadMaxRows", "ReadMinRows",
    "SupportsTriggerAvailableNow", "DataSourceStreamArrowWriter", "is_already_registered",
]


def _arrow_schema_function() -> Callable:
    """``to_arrow_schema`` called so that TIMESTAMP maps to ``timestamp("us", tz="UTC")``: 4.2+ takes
    ``timezone="UTC"``, 4.0 and 4.1 ``timestamp_utc=True`` (their default)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    params = inspect.signature(to_arrow_schema).parameters
    if "timezone" in params:
        return lambda schema: to_arrow_schema(schema, timezone="UTC")
    if "timestamp_utc" in params:
        return lambda schema: to_arrow_schema(schema, timestamp_utc=True)
    return to_arrow_schema


@dataclass(frozen=True)
class Capabilities:
    """The running pyspark's Python Data Source features that spark-mq adapts to."""

    pyspark_version: str
    #: ReadLimit classes exist (and so the runner that passes them): latestOffset(start, limit),
    #: getDefaultReadLimit, reportLatestOffset
    read_limits: bool
    #: SupportsTriggerAvailableNow: trigger(availableNow=True) runs many batches up to a fixed target;
    #: without it Spark runs availableNow as a single batch
    available_now: bool
    #: DataSourceStreamArrowWriter: a streaming sink receives Arrow batches, not Rows
    stream_arrow_writer: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _detect() -> Capabilities:
    # the ReadLimit classes and the runner that passes them to latestOffset(start, limit) ship together
    limits = ReadMaxRows is not None
    return Capabilities(
        pyspark_version=pyspark.__version__,
        read_limits=limits,
        available_now=limits and SupportsTriggerAvailableNow is not None,
        stream_arrow_writer=DataSourceStreamArrowWriter is not None,
    )


CAPS = _detect()
_ARROW_SCHEMA = _arrow_schema_function()


def arrow_schema_of(schema) -> "pyarrow.Schema":  # noqa: F821 - pyarrow imported by pyspark's function
    """The Arrow schema Spark uses for ``schema`` (a StructType), timestamps in UTC, on every pyspark."""
    return _ARROW_SCHEMA(schema)


def is_already_registered(exc: BaseException) -> bool:
    """Is ``exc`` Spark's refusal to register a data source name that exists (pyspark 4.0 raises
    ``DATA_SOURCE_ALREADY_EXISTS``; later versions replace the registration with a warning)? Works for
    classic and Spark Connect errors alike."""
    condition: Optional[str] = None
    for getter in ("getCondition", "getErrorClass"):
        fn = getattr(exc, getter, None)
        if callable(fn):
            try:
                condition = fn()
            except Exception:  # noqa: BLE001 - an error object without the field
                condition = None
            if condition:
                break
    return condition == "DATA_SOURCE_ALREADY_EXISTS" or "DATA_SOURCE_ALREADY_EXISTS" in str(exc)


if __name__ == "__main__":
    print(json.dumps(CAPS.as_dict(), indent=2))
