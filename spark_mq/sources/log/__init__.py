"""The durable source log of a source: message batches as Arrow IPC segment files under ``logLocation``.

``SourceLog`` (``sourcelog``) is the log the sources use; the modules beside it hold its parts:
the segment layout and index entries (``segments``), Arrow IPC encoding, scanning and reading back
(``ipc``; ``read_slice`` runs on executors), appending on a local filesystem (``local``) or on
others (``remote``), deleting committed segments (``deleter``), and one writer per location
(``lock``: an ``flock`` locally; ``lease``: a renewed file elsewhere).
"""

from spark_mq.sources.log.ipc import read_slice
from spark_mq.sources.log.lock import WriterLock
from spark_mq.sources.log.segments import (SEGMENT_PREFIX, DataLossError, LogCorruptError, LogInUseError, LogSlice,
                                           open_filesystem)
from spark_mq.sources.log.sourcelog import SourceLog

__all__ = ["SourceLog", "LogSlice", "LogCorruptError", "DataLossError", "LogInUseError", "WriterLock",
           "open_filesystem", "read_slice", "SEGMENT_PREFIX"]
