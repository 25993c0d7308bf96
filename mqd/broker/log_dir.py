"""One partition log's folder: its segment files opened, created and removed, and the error a log raises.

``<data_dir>/logs/<topic>-<partition>/`` holds the segment files (``<base:020d>.log|.index|.timeindex``,
:mod:`mqd.broker.segment`) and the log's records. :class:`LogDir` names the folder and does the file
work the log (storage.py), its loader (log_loader.py) and the fenced-range fill (fenced_ranges.py)
share, with no state of its own; a failed disk operation becomes a :class:`StorageError` noted in the
node's :class:`mqd.broker.disk_health.DiskHealth` (:meth:`LogDir.disk_error`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from bisect import bisect_left
from pathlib import Path

from mqd.broker.disk_health import DISK_ERRNOS, DiskHealth
from mqd.broker.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, Segment, segment_name
from mqd.errors import MqdError

REPAIR_SUFFIX = ".repair"  # a segment being rewritten by a fenced-range fill, renamed over it when done


class StorageError(MqdError):
    """A log cannot be read or written, or an append breaks the log's offset rules."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message, retriable=retriable)


@dataclasses.dataclass(frozen=True, slots=True)
class LogDir:
    """The folder of partition ``topic``-``partition`` and the node's disk health it reports to."""

    topic: str
    partition: int
    path: Path
    disk: DiskHealth

    def segment_path(self, base: int) -> Path:
        """The log file of the segment starting at ``base``."""
        return self.path / (segment_name(base) + LOG_SUFFIX)

    def open_segment(self, path: Path, base: int, start_byte: int) -> Segment:
        """The segment file at ``path`` opened for reading and appending (created when missing)."""
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        seg = Segment(path, base, fd, start_byte)
        seg.size = os.fstat(fd).st_size
        return seg

    def create_segment(self, base: int, start_byte: int) -> Segment:
        """A new empty segment at ``base`` (the folder changes: the caller fsyncs it in time)."""
        seg = self.open_segment(self.segment_path(base), base, start_byte)
        if seg.size:
            # a leftover file under this name can only be stale: the log says nothing lives here
            os.ftruncate(seg.fd, 0)
            seg.size = 0
        seg.remove_indexes()
        return seg

    @staticmethod
    def cut_segment(seg: Segment, bi: int) -> None:
        """Cut ``seg`` before its entry ``bi`` (after its last one when ``bi`` is past it), file and
        in-memory index: it ends at that entry's offset and is the active segment again (its index
        files go: the active segment's index is rebuilt on open)."""
        new_end = seg.offsets[bi] if bi < len(seg.offsets) else seg.next_offset
        new_size = seg.positions[bi] if bi < len(seg.positions) else seg.size
        os.ftruncate(seg.fd, new_size)
        seg.size = new_size
        del seg.offsets[bi:]
        del seg.positions[bi:]
        ti = bisect_left(seg.ts_offsets, new_end)
        del seg.ts_offsets[ti:]
        del seg.ts_values[ti:]
        seg.holes = [h for h in seg.holes if h.first < new_end]
        seg.next_offset = new_end
        seg.remove_indexes()

    @staticmethod
    def unlink_segment_files(log_path: Path) -> None:
        """Remove a segment's log file and its indexes (any of them may be missing)."""
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            log_path.with_suffix(suffix).unlink(missing_ok=True)

    def disk_error(self, exc: OSError, what: str) -> StorageError:
        """The StorageError for a failed disk operation, noted in the node's disk health."""
        self.disk.note_error(exc, what)
        self.disk.probe_soon()
        retriable = exc.errno in DISK_ERRNOS and exc.errno != errno.EIO
        return StorageError(f"{self.topic}-{self.partition}: {what} failed: {exc}", retriable=retriable)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` at ``fd``'s position (os.write may write less than asked)."""
    view = memoryview(data)
    written = 0
    while written < len(view):
        written += os.write(fd, view[written:])
