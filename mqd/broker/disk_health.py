"""DiskHealth: whether a broker node's data dir can be written, for ``/v1/health`` and produce.

A node whose disk is full or read-only still serves reads, so it stays alive for its peers, but
it must say why writes fail (issue 12: health said ``ok`` while every produce failed with ENOSPC).
Two sources feed one answer, the newest wins:

- errors the logs meet on a write, an fsync or a segment roll (:meth:`DiskHealth.note_error`);
- a cheap probe (create, write 4 KiB, fsync, unlink a dot file in the data dir), run in a worker
  thread at most every ``probe_interval`` seconds when health is asked or a write failed
  (:meth:`DiskHealth.probe_soon`). The probe is what notices a read-only remount or bind mount:
  files already open may stay writable there, new ones cannot be created (the next roll would
  fail). A successful probe is the only thing that clears a problem.

While a problem is known, appends are refused with it (storage.py), so a producer gets a clear
error instead of a write that a later roll or fsync would lose.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import threading
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

PROBE_FILE = ".health-probe"
_PROBE_BYTES = b"\0" * 4096
# errnos that say "this disk cannot take writes", as opposed to a bug or a closed log
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def describe(exc: OSError) -> str:
    """``read-only file system (EROFS)``: the errno's text and its name, for people and for grep."""
    name = errno.errorcode.get(exc.errno or 0, "unknown errno")
    return f"{(exc.strerror or str(exc)).lower()} ({name})"


class DiskHealth:
    """The writability of one data dir: ``problem`` is None while it is fine."""

    def __init__(self, data_dir: Path, *, probe_interval: float = 1.0) -> None:
        self.data_dir = Path(data_dir)
        self.probe_interval = probe_interval
        self.problem: str | None = None
        self._lock = threading.Lock()  # note_error may come from the fsync worker thread
        self._errors = 0  # errors noted so far: a probe that overlapped one does not clear it
        self._last_probe = -float("inf")
        self._probing = False

    @property
    def probing(self) -> bool:
        """A probe is running in a worker thread."""
        return self._probing

    def note_error(self, exc: OSError, what: str) -> bool:
        """Record a failed disk operation; True when its errno says the disk is the problem."""
        if exc.errno not in DISK_ERRNOS:
            return False
        problem = f"data dir {self.data_dir}: {what} failed: {describe(exc)}"
        with self._lock:
            changed, self.problem = self.problem != problem, problem
            self._errors += 1
        if changed:
            log.error("disk problem", problem=problem)
        return True

    def probe(self) -> str | None:
        """Try a small durable write in the data dir (blocking); the problem found, or None."""
        path = self.data_dir / PROBE_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, _PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError as exc:
            return f"data dir {self.data_dir}: probe write failed: {describe(exc)}"
        return None

    def probe_soon(self) -> None:
        """Start a probe in a worker thread unless one ran within ``probe_interval`` or is running;
        never waits for it (a slow disk must not make the health answer slow: peers would take the
        node for dead). Outside an event loop it does nothing."""
        now = time.monotonic()
        if self._probing or now - self._last_probe < self.probe_interval:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._last_probe, self._probing = now, True
        # an executor future, not a task: the loop's shutdown waits for it, nothing is left pending
        future = loop.run_in_executor(None, self.probe)
        future.add_done_callback(functools.partial(self._probe_done, self._errors))

    def _probe_done(self, errors_before: int, future: asyncio.Future[str | None]) -> None:
        self._probing = False
        if future.cancelled():
            return
        exc = future.exception()
        problem = future.result() if exc is None else f"data dir {self.data_dir}: probe failed: {exc}"
        with self._lock:
            if problem is None and self._errors != errors_before:
                return  # an error noted while the probe ran is newer than its success
            before, self.problem = self.problem, problem
        if problem != before:
            if problem is None:
                log.info("disk writable again", data_dir=str(self.data_dir), was=before)
            else:
                log.error("disk problem", problem=problem)


__all__ = ["DISK_ERRNOS", "PROBE_FILE", "DiskHealth", "describe"]
