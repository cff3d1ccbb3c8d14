"""One writer per source log on filesystems without locks (object stores, HDFS through pyarrow).

Responsible for: the ``writer.lease`` file of a non-local log: taking it (waiting for a holder
that is gone), renewing it while the log is open, noticing when another reader took it, and
deleting it on close. Local logs use ``lock.WriterLock`` (an ``flock``) instead.

A lease is best effort, not a lock: object stores have no portable compare-and-swap through
pyarrow. It turns the common mistake (two queries, or two copies of one notebook, on one
``logLocation``) into an error that names the location and the holder, instead of two writers
recovering, appending to and deleting each other's segments.

    lease = WriterLease(fs, root, location, wait=10.0)   # raises LogInUseError while a holder lives
    ...
    lease.check()                                         # before each write: raises once it was taken
    lease.release()

The file holds one JSON object: the holder's random token, a renewal counter, its host, boot id,
pid and process start time. Liveness is judged without comparing clocks of different machines:
the holder rewrites the file every ``renew`` seconds with the counter increased, and a waiting
reader calls the lease abandoned once the file has not changed for ``ttl`` seconds of its own
clock. A holder on the same machine (same host name and boot id) whose process is gone (or is
another process with the same pid) is abandoned at once: the common case of a query restarted
after Spark killed its reader process, which never runs a clean-up. After writing its own lease a
reader waits ``settle`` seconds and reads it back, so of two readers starting together one fails.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Optional

import pyarrow.fs as pafs

from spark_mq.sources.log.segments import LogInUseError

__all__ = ["LEASE_NAME", "WriterLease"]

log = logging.getLogger("spark_mq.sources.log")

LEASE_NAME = "writer.lease"
TTL = 30.0      # seconds without a renewal after which a holder on another machine is gone
RENEW = 5.0     # seconds between renewals
SETTLE = 1.0    # seconds between writing a lease and reading it back


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or _start_time(pid) in (None, started)


def _describe(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, lease renewed {holder.get('seq', 0)} times"


class WriterLease:
    """The lease of one open log (see the module docstring)."""

    def __init__(self, fs: pafs.FileSystem, root: str, location: str, wait: float, *,
                 ttl: Optional[float] = None, renew: Optional[float] = None,
                 settle: Optional[float] = None) -> None:
        self.fs, self.location = fs, location
        self.path = f"{root.rstrip('/')}/{LEASE_NAME}"
        self.ttl = TTL if ttl is None else ttl
        self.renew = RENEW if renew is None else renew
        self.settle = SETTLE if settle is None else settle
        self.token = uuid.uuid4().hex
        self._seq = 0
        self._mine = {"token": self.token, "host": socket.gethostname(), "boot": _boot_id(), "pid": os.getpid(),
                      "started": _start_time(os.getpid())}
        self._lost: Optional[str] = None
        self._stop = threading.Event()
        self._acquire(wait)
        self._thread = threading.Thread(target=self._renew_loop, name="spark-mq-lease", daemon=True)
        self._thread.start()

    # -- the file -------------------------------------------------------------------------------

    def _read(self) -> Optional[dict]:
        try:
            with self.fs.open_input_stream(self.path) as f:
                data = f.read()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(data)
        except ValueError:  # a torn write of a lease: treat it as a holder that must still expire
            return {"token": f"unreadable:{data[:64]!r}"}
        return holder if isinstance(holder, dict) else {"token": repr(holder)[:64]}

    def _write(self) -> None:
        """Write the whole lease under another name and move it over the lease: a reader never sees
        half of one (a rename locally; object stores publish an object whole)."""
        self._seq += 1
        data = json.dumps({**self._mine, "seq": self._seq}).encode()
        tmp = f"{self.path}.{self.token}.new"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, self.path)

    # -- taking it ------------------------------------------------------------------------------

    def _gone_here(self, holder: dict) -> bool:
        """A holder on this machine whose process has ended."""
        if holder.get("host") != self._mine["host"] or holder.get("boot") != self._mine["boot"]:
            return False
        pid = holder.get("pid")
        return isinstance(pid, int) and not _alive(pid, holder.get("started"))

    def _acquire(self, wait: float) -> None:
        t0 = time.monotonic()
        last, since, changed = None, t0, False
        while True:
            holder = self._read()
            now = time.monotonic()
            if holder is None or self._gone_here(holder):
                break
            if holder != last:
                changed = changed or last is not None
                last, since = holder, now
            if now - since >= self.ttl:
                log.warning("source log %s: taking over the lease of %s, not renewed for %.0fs",
                            self.location, _describe(holder), now - since)
                break
            if changed and now - t0 >= wait:
                raise LogInUseError(
                    f"logLocation {self.location} is in use by another source reader ({_describe(holder)}); "
                    f"waited {now - t0:.0f}s and it is still renewing {self.path}. Each query needs its own "
                    f"logLocation; the lease of a reader that was killed lapses after {self.ttl:.0f}s.")
            time.sleep(min(1.0, self.renew / 2))
        self._write()
        time.sleep(self.settle)
        holder = self._read()
        if holder is None or holder.get("token") != self.token:
            raise LogInUseError(
                f"logLocation {self.location}: another source reader took {self.path} at the same time "
                f"({_describe(holder or {})}). Each query needs its own logLocation.")

    # -- holding it -----------------------------------------------------------------------------

    def _renew_loop(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(self.renew):
            try:
                holder = self._read()
                if holder is None or holder.get("token") != self.token:
                    self._lost = (f"logLocation {self.location}: the writer lease {self.path} was taken by "
                                  f"another source reader ({_describe(holder or {})}); this reader stops writing. "
                                  f"Each query needs its own logLocation.")
                    log.error("%s", self._lost)
                    return
                self._write()
                renewed = time.monotonic()
            except OSError as exc:
                log.warning("source log %s: renewing the writer lease failed: %s", self.location, exc)
                if time.monotonic() - renewed > self.ttl:
                    self._lost = (f"logLocation {self.location}: the writer lease {self.path} could not be renewed "
                                  f"for {self.ttl:.0f}s ({exc}); another reader may have taken the log over")
                    log.error("%s", self._lost)
                    return

    def check(self) -> None:
        """Raise ``LogInUseError`` once another reader has taken the lease (checked before each write)."""
        if self._lost is not None:
            raise LogInUseError(self._lost)

    def release(self) -> None:
        self._stop.set()
        self._thread.join(self.renew + 5.0)
        if self._lost is not None:
            return
        try:
            holder = self._read()
            if holder is not None and holder.get("token") == self.token:
                self.fs.delete_file(self.path)
        except OSError as exc:
            log.warning("source log %s: removing the writer lease failed: %s", self.location, exc)
