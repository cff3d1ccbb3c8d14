"""Building a sink's ``SinkPlan`` on the driver at query start (shared by the three formats).

Responsible for: dropping the options Spark itself adds (``checkpointLocation``, ``path``), parsing
the rest with the shared parser, defaulting the commit log into a local checkpoint directory,
refusing ``df.write`` in overwrite mode (a broker cannot be truncated), checking the input columns
(``spark_mq.sinks.columns``) and the format's own cross-checks. Everything here runs before any task,
so a mistake fails the query at start with a message naming the option or column.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Mapping, Optional
from urllib.parse import urlsplit

from pyspark.sql.types import StructType

from spark_mq.clients.connect import endpoints
from spark_mq.errors import OptionError
from spark_mq.options import Options
from spark_mq.sinks.bridge import Bridge, detect
from spark_mq.sinks.columns import ColumnPlan, ColumnSpec, SinkSchemaError, validate
from spark_mq.sinks.options import parse_sink_options
from spark_mq.sinks.writer import SinkPlan, arrow_schema_of, new_write_id, write_key

__all__ = ["build_plan", "SPARK_OPTIONS", "COMMIT_LOG_DIR"]

#: Options that Spark adds to a writer's options on its own (lower-case, as Spark passes them).
SPARK_OPTIONS = ("checkpointlocation", "path", "queryname")  # queryName(...) arrives as an option
#: Sub-directory of a local checkpoint location used as the default commit log.
COMMIT_LOG_DIR = "spark-mq-sink-commits"


def _local_dir(location: Optional[str]) -> Optional[str]:
    if not location:
        return None
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return parts.path if parts.scheme else location
    return None


def build_plan(
    fmt: str,
    raw: Mapping[str, str],
    schema: StructType,
    overwrite: bool,
    *,
    streaming: bool,
    columns: Iterable[ColumnSpec],
    open_session: Callable,
    make_encoder: Callable,
    check: Optional[Callable[[Options, ColumnPlan], None]] = None,
) -> SinkPlan:
    lowered = {str(k).lower(): v for k, v in raw.items()}
    checkpoint = lowered.get("checkpointlocation")
    opts = parse_sink_options({k: v for k, v in raw.items() if str(k).lower() not in SPARK_OPTIONS}, fmt)
    if overwrite and not streaming:
        raise OptionError(f"the {fmt} sink only appends messages: use mode('append'), not mode('overwrite')")
    if not opts.get("commitLogLocation"):
        local = _local_dir(checkpoint)
        if local:
            opts = opts.replace(commitLogLocation=os.path.join(local, COMMIT_LOG_DIR))
    endpoints(opts)  # URI errors here, on the driver, not in every task
    bridge = _bridge(fmt, schema, opts)
    checked = schema if bridge is None else bridge.output_schema()
    plan_columns = validate(checked, columns, fmt, ignore_extra=opts.ignoreExtraColumns)
    if check is not None:
        check(opts, plan_columns)
    return SinkPlan(fmt, opts, plan_columns, arrow_schema_of(schema), new_write_id(),
                    write_key(fmt, opts, schema.fieldNames()), open_session, make_encoder, bridge)


def _bridge(fmt: str, schema: StructType, opts) -> Optional[Bridge]:
    """A ``Bridge`` when the input is a spark-mq source's rows (see ``spark_mq.sinks.bridge``)."""
    fields = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    found = detect(fields)
    if found is None:
        return None
    source, unknown = found
    if unknown and not opts.ignoreExtraColumns:
        raise SinkSchemaError(
            f"the DataFrame cannot be written to the {fmt} sink: it holds the rows of a {source} source, and "
            + "; ".join(f"column {name!r} is not a column of that source" for name in unknown)
            + " (set ignoreExtraColumns=true to ignore them)")
    return Bridge(source, fmt, fields, opts, unknown)
