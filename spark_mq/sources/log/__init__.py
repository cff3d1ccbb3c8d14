"""The durable source log of a source: message batches as Arrow IPC segment files under ``logLocation``
(``sourcelog``), with one writer per location (``lease`` on filesystems without locks)."""

from spark_mq.sources.log.sourcelog import (SEGMENT_PREFIX, DataLossError, LogCorruptError, LogInUseError, LogSlice,
                                            SourceLog, WriterLock, open_filesystem, read_slice)

__all__ = ["SourceLog", "LogSlice", "LogCorruptError", "DataLossError", "LogInUseError", "WriterLock",
           "open_filesystem", "read_slice", "SEGMENT_PREFIX"]
