"""Broker storage: one append-only log of record batches per partition, in segment files.

Layout: ``<data_dir>/logs/<topic>-<partition>/<base_offset:020d>.log|.index|.timeindex``. One
segment (its log file and its offset and timestamp indexes) is :class:`mqd.broker.segment.Segment`;
this file holds the partition log over its segments (appends and rolls, reads, truncation,
retention, the fsync policy) and the set of logs of a node (:class:`Storage`). The log's pieces, the
way Kafka splits its log: the folder and its segment files (log_dir.py, with :class:`StorageError`),
the open (log_loader.py: recovery, the incarnation history), the fenced ranges (fenced_ranges.py:
derived, recorded, filled from a replica) and the read plans (segment_reads.py).

The indexes are also kept in memory (``array``) so lookups are a bisect. They are derived data,
written when a segment is rolled (closed). On open, a closed segment's index is trusted when it
is consistent with the log file (:meth:`Segment.load_indexes`: its first and last batches read back
intact where the index puts them, the last one ending at the file size), so start-up does not grow
with the whole log; otherwise, and always for the active (last) segment, the index is rebuilt by
scanning the log with CRC checks (``segments_trusted`` / ``segments_scanned`` count both).

Recovery keeps intact data (issue 12). A damaged batch (a CRC that fails) with intact batches
after it, in any segment, is *fenced*: the scan resynchronises on the next intact batch and records
the offsets in between as a hole (:class:`mqd.broker.segment.Hole`); a closed segment cut short or
lost leaves its missing offsets fenced up to the next segment's base. A fenced range is never read
(a read stops before it), a fetch there answers DATA_LOST, ``fenced.json`` in the partition folder
records the ranges, ``/v1/health`` reports them (degraded) and a replica can repair them
(:meth:`PartitionLog.repair_fenced`). Only a torn tail of the active segment, with nothing intact
after it, is cut (those records were never acknowledged as flushed), and that cut begins a new
incarnation at the cut offset.

Every partition log has an incarnation history (:mod:`mqd.broker.incarnation`): a log created empty
or recreated begins one at 0, every truncation (a recovery cut, a slave following its master, a
reset) begins one at the new log end before it cuts, or adopts the master's history. So does an
open after a crash (no ``.clean_shutdown`` marker, which a clean close writes) unless every append
was fsynced: records are served before they are flushed, and a crash may take them back without a
torn byte (the file reverts to its last synced size).

A trusted index proves only a segment's first and last batches: the background scrub
(:mod:`mqd.broker.scrub`) reads every closed segment's batches through :meth:`PartitionLog.scrub_view`
(a dup of the fd and a copy of the index, so it reads outside the lock) and fences a damaged one
with :meth:`PartitionLog.fence_damaged`, the same hole, record and report as a fence found at open.

Disk errors (ENOSPC, EROFS, EIO on a write, an fsync or a roll) are noted in the node's
:class:`mqd.broker.disk_health.DiskHealth`, which ``/v1/health`` reports; while it knows a problem,
appends are refused with it.

Threading: a log is used from the event loop thread; ``flush()`` (and ``Storage.flush_all()``)
may run in a worker thread at the same time. A per-log ``threading.Lock`` guards the segment list,
the indexes and the fds; fsync happens outside it, on a dup of the fd, so a concurrent roll or
retention that closes the original fd cannot break it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import structlog

from mqd.broker.disk_health import DiskHealth
from mqd.broker.fenced_ranges import FENCED_FILE, FencedRanges, FillReadBack, fill_fenced, fill_target
from mqd.broker.incarnation import IncarnationHistory
from mqd.broker.log_dir import LogDir, StorageError, write_all
from mqd.broker.log_loader import LogLoader, begin_incarnation
from mqd.broker.segment import Segment
from mqd.broker.segment_reads import (
    ReadPlan,
    ScrubView,
    plan_batches,
    read_bytes,
    read_into_buffer,
    scrub_entries,
)
from mqd.config import StorageConfig
from mqd.fsutil import atomic_write, fsync_dir
from mqd.topic_name import topic_name_problem
from mqd.wire.format import BatchInfo, set_base_offset
from mqd.wire.incarnation import IncarnationEntry

log = structlog.get_logger(__name__)

LOCK_FILE = ".lock"
# in <data_dir>/logs, written by a clean close, removed at open: its absence means a crash
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
_U32_MAX = 2**32 - 1
# positions are u32 in the index file; keep every segment well inside that
MAX_SEGMENT_BYTES = 2**31


def _segment_chunks(infos: list[BatchInfo], used: int, segment_bytes: int) -> list[tuple[int, int]]:
    """Split consecutive batches into [lo, hi) runs that each fit what is left of a segment
    (a run always holds at least one batch, as a batch is never split)."""
    runs: list[tuple[int, int]] = []
    lo, size = 0, used
    for i, info in enumerate(infos):
        if size > 0 and size + info.length > segment_bytes:  # batch i opens the next segment
            if i > lo:
                runs.append((lo, i))
                lo = i
            size = 0
        size += info.length
    if lo < len(infos):
        runs.append((lo, len(infos)))
    return runs


def _check_layout(data: bytes | bytearray, infos: list[BatchInfo]) -> None:
    """``infos`` must describe ``data`` completely: contiguous whole batches from position 0."""
    if not infos:
        raise StorageError("append of no batches", retriable=False)
    pos = 0
    for info in infos:
        if info.position != pos:
            raise StorageError(
                f"batch infos do not describe the data (batch at {info.position})", retriable=False
            )
        pos += info.length
    if pos != len(data):
        raise StorageError(f"batch infos cover {pos} of {len(data)} bytes", retriable=False)


class PartitionLog:
    """The log of one partition: segments ordered by base offset, the last one takes appends."""

    def __init__(
        self,
        topic: str,
        partition: int,
        directory: Path,
        config: StorageConfig,
        disk: DiskHealth | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.directory = directory
        self._config = config
        self._disk = disk if disk is not None else DiskHealth(directory)
        self._dir = LogDir(topic, partition, directory, self._disk)
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offset of every segment, for bisect
        self._lock = threading.Lock()
        self._dir_dirty = False
        self._closed = False
        self._failed: str | None = None  # set when a failed write could not be undone
        self._history = IncarnationHistory(directory)
        # offset ranges this log cannot serve: holes in segments and gaps between them
        self._fenced = FencedRanges(self._dir)
        self._loader = LogLoader(self._dir, self._history, self._fenced)
        # what open() did with each segment: start-up cost grows with the scanned ones only
        self.segments_trusted = 0
        self.segments_scanned = 0

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic}-{self.partition}, [{self.min_offset}, {self.max_offset}))"

    # -- offsets -----------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """Log start offset: the first offset that can be read."""
        return self._segments[0].base_offset

    @property
    def max_offset(self) -> int:
        """Log end offset: the next offset to be written."""
        return self._segments[-1].next_offset

    # -- incarnation -------------------------------------------------------------------------------

    @property
    def incarnation(self) -> str:
        """The current incarnation id: which records this log's offsets name (incarnation.py)."""
        return self._history.current

    @property
    def history(self) -> list[IncarnationEntry]:
        """The incarnation history, oldest first (replica fetch answers carry it to the slaves)."""
        return self._history.entries

    def diverged_at(self, incarnation: str, lineage: Sequence[tuple[str, int]] = ()) -> int | None:
        """Where this log stops holding the records of a consumer at ``incarnation`` (which fetched
        under the ``lineage`` ids before it); None when it is the current one
        (:meth:`mqd.broker.incarnation.IncarnationHistory.diverged_for`)."""
        return self._history.diverged_for(incarnation, lineage)

    def knows_incarnation(self, incarnation: str) -> bool:
        """``incarnation`` is in this log's history (current, earlier or retired)."""
        return self._history.knows(incarnation)

    def adopt_history(self, entries: list[IncarnationEntry]) -> None:
        """Take the master's history as this log's (slave side; durable on return). The caller
        makes sure this log holds the master's records under it (truncate first when not)."""
        with self._lock:
            self._check_writable()
            try:
                self._history.adopt(entries)
            except OSError as exc:
                raise self._disk_error(exc, "history write") from exc

    def begin_incarnation(self, why: str) -> None:
        """Start a new incarnation at the log end (durable on return): the offsets from there on
        may name records other than the ones this log's current id named there before (a master
        that took its records back from a slave cannot know how far its lost log had served)."""
        with self._lock:
            self._check_writable()
            begin_incarnation(self._dir, self._history, self.max_offset, why)

    # -- fenced ranges -----------------------------------------------------------------------------

    def fenced_ranges(self) -> list[tuple[int, int]]:
        """Offset ranges ``(first, last)`` (inclusive) this log cannot serve, in offset order: damaged
        bytes no replica repaired, offsets missing between segments. Fetches answer DATA_LOST there."""
        return list(self._fenced.ranges)

    def fenced_at(self, offset: int) -> tuple[int, int] | None:
        """The fenced range ``(first, last)`` (inclusive) holding ``offset``, or None."""
        return self._fenced.at(offset)

    # -- scrub (scrub.py) --------------------------------------------------------------------------

    def closed_segments(self) -> list[Segment]:
        """Every segment but the active one, in offset order (what the scrub walks)."""
        with self._lock:
            return [] if self._closed else self._segments[:-1]

    def is_closed_segment(self, seg: Segment) -> bool:
        """``seg`` is still a closed segment of this log (not deleted, rewritten or made active)."""
        with self._lock:
            return not self._closed and any(s is seg for s in self._segments[:-1])

    def scrub_view(self, seg: Segment) -> ScrubView | None:
        """``seg``'s batches for a scrub outside the lock; None when it is no longer closed here."""
        with self._lock:
            if self._closed or not any(s is seg for s in self._segments[:-1]):
                return None
            return ScrubView(seg, os.dup(seg.fd), seg.size, scrub_entries(seg))

    def fence_damaged(self, seg: Segment, offset: int, position: int, why: str) -> tuple[int, int] | None:
        """Fence the batch entry at ``offset`` (file position ``position``) of closed segment ``seg``,
        found damaged after open (scrub.py): it becomes a hole, ``fenced.json`` records it, an error
        line names it, fetches there answer DATA_LOST. The segment's index files go (a segment with
        holes is rescanned at open, which finds the damage again). Returns the fenced range, or None
        when the segment or the entry is no longer what was read (deleted, repaired, truncated)."""
        with self._lock:
            if self._closed or not any(s is seg for s in self._segments[:-1]):
                return None
            i = seg.batch_index(offset)
            if i < 0 or seg.offsets[i] != offset or seg.positions[i] != position or seg.hole_at(offset):
                return None
            return self._fenced.fence_batch(self._segments, seg, i, why)

    def append_fenced(self, first: int, last: int) -> None:
        """Continue this log with a fenced range ``first..last`` and no bytes (slave side: the
        master answered DATA_LOST there, so no replica holds those records); ``first`` must be
        the log end. The next append continues at ``last + 1``."""
        with self._lock:
            self._check_writable()
            if first != self.max_offset or last < first:
                raise StorageError(
                    f"{self.topic}-{self.partition}: fenced range {first}..{last} does not continue "
                    f"the log at {self.max_offset}",
                    retriable=False,
                )
            seg = self._segments[-1]
            seg.add_hole(first, last, seg.size, seg.size)
            self._fenced.refresh(self._segments)

    def repair_fenced(self, data: bytes, infos: list[BatchInfo]) -> None:
        """Replace one fenced range with intact batches from a replica (verbatim, offsets kept):
        ``infos`` (``data``'s batches, validated by the caller) must cover exactly the range that
        starts at their first offset. A hole in a segment is replaced by rewriting that segment
        (a new file renamed over it); a gap between segments becomes a new segment
        (fenced_ranges.fill_fenced). Durable on return; the range is no longer fenced."""
        _check_layout(data, infos)
        with self._lock:
            self._check_writable()
            target = fill_target(self._dir, self._segments, self._fenced, infos)
            if target.hole is None:
                self._dir_dirty = True  # a new segment file
            try:
                fill_fenced(self._dir, self._segments, self._fenced, target, data)
            except FillReadBack as exc:
                self._failed = exc.reason
                raise
            finally:
                self._bases = [seg.base_offset for seg in self._segments]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- open / recovery ---------------------------------------------------------------------------

    def open(self, *, after_crash: bool = False) -> None:
        """Create or recover the log (blocking; log_loader.LogLoader). ``after_crash``: the node did
        not close cleanly and appends were not each fsynced, so the tail may have lost records that
        were served (a file reverted to its last synced size shows no torn bytes): unless recovery
        cut something already, the log begins a new incarnation at its end."""
        loaded = self._loader.load(after_crash=after_crash)
        self._segments = loaded.segments
        self._bases = [seg.base_offset for seg in loaded.segments]
        self._dir_dirty = loaded.dir_dirty
        self.segments_trusted, self.segments_scanned = loaded.trusted, loaded.scanned
        log.debug(
            "log opened",
            topic=self.topic,
            partition=self.partition,
            min_offset=self.min_offset,
            max_offset=self.max_offset,
            segments=len(self._segments),
            trusted=self.segments_trusted,
            scanned=self.segments_scanned,
        )

    def _new_segment(self, base: int) -> Segment:
        start_byte = self._segments[-1].start_byte + self._segments[-1].size if self._segments else 0
        seg = self._create_segment(base, start_byte)
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        return seg

    def _create_segment(self, base: int, start_byte: int) -> Segment:
        seg = self._dir.create_segment(base, start_byte)
        self._dir_dirty = True
        return seg

    # -- append ------------------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageError(f"{self.topic}-{self.partition}: log is closed", retriable=True)
        if self._failed is not None:
            raise StorageError(f"{self.topic}-{self.partition}: log failed: {self._failed}", retriable=False)
        problem = self._disk.problem
        if problem is not None:
            # a write now could be lost by the next roll or fsync: refuse until a probe succeeds
            self._disk.probe_soon()
            raise StorageError(f"{self.topic}-{self.partition}: not writable: {problem}", retriable=True)

    def _disk_error(self, exc: OSError, what: str) -> StorageError:
        """The StorageError for a failed disk operation, noted in the node's disk health."""
        return self._dir.disk_error(exc, what)

    def append(self, data: bytes, infos: list[BatchInfo]) -> tuple[int, int]:
        """Assign offsets to validated batches and write them; returns (first, last) offset."""
        _check_layout(data, infos)
        buf = bytearray(data)
        with self._lock:
            self._check_writable()
            first = next_offset = self.max_offset
            for info in infos:
                set_base_offset(buf, info.position, next_offset)
                next_offset += info.count
            fd = self._write_locked(buf, infos, first)
        self._sync_after_append(fd)
        return first, next_offset - 1

    def append_replica(self, data: bytes, infos: list[BatchInfo]) -> None:
        """Append a master's batches verbatim (slave side): they must continue this log exactly."""
        _check_layout(data, infos)
        with self._lock:
            self._check_writable()
            expected = self.max_offset
            for info in infos:
                if info.base_offset != expected:
                    raise StorageError(
                        f"{self.topic}-{self.partition}: replica batch at offset {info.base_offset}, "
                        f"log end is {expected}",
                        retriable=False,
                    )
                expected = info.next_offset
            # Split at segment boundaries: one catch-up answer can hold many segments' worth, and a
            # single oversized segment would keep size retention from ever deleting anything here.
            fds = []
            for lo, hi in _segment_chunks(infos, self._segments[-1].size, self._config.segment_bytes):
                start = infos[lo].position
                end = infos[hi - 1].position + infos[hi - 1].length
                chunk = [dataclasses.replace(info, position=info.position - start) for info in infos[lo:hi]]
                fds.append(self._write_locked(memoryview(data)[start:end], chunk, infos[lo].base_offset))
        for fd in fds:
            self._sync_after_append(fd)

    def _write_locked(self, data: bytes | bytearray | memoryview, infos: list[BatchInfo], first: int) -> int:
        count = sum(info.count for info in infos)
        seg = self._segments[-1]
        if seg.size > 0 and (
            seg.size + len(data) > self._config.segment_bytes or first + count - seg.base_offset > _U32_MAX
        ):
            try:
                seg = self._roll_locked(first)
            except OSError as exc:  # the old segment stays the active one: nothing changed
                raise self._disk_error(exc, "segment roll") from exc
        if seg.size + len(data) > _U32_MAX:
            raise StorageError(f"{len(data)} bytes do not fit a segment", retriable=False)
        start = seg.size
        try:
            write_all(seg.fd, data)
        except OSError as exc:
            self._undo_write(seg, start, exc)
            raise self._disk_error(exc, "write") from exc
        seg.size = start + len(data)
        seg.dirty = True
        offset = first
        for info in infos:
            seg.add_batch(offset, info.count, start + info.position, info.max_timestamp)
            offset += info.count
        return seg.fd

    def _undo_write(self, seg: Segment, size: int, exc: OSError) -> None:
        try:
            os.ftruncate(seg.fd, size)
        except OSError as exc2:
            # the file may now hold a partial batch we cannot take back: refuse further writes
            self._failed = f"write failed ({exc}) and could not be undone ({exc2})"
            log.error("log failed", topic=self.topic, partition=self.partition, reason=self._failed)

    def _sync_after_append(self, fd: int) -> None:
        if self._config.fsync != "always":
            return
        # only the loop thread appends, rolls and closes, so fd is still open here
        try:
            os.fsync(fd)
            if self._dir_dirty:
                self._dir_dirty = False
                fsync_dir(self.directory)
        except OSError as exc:
            err = self._disk_error(exc, "fsync")
            raise StorageError(str(err), retriable=False) from exc

    def _roll_locked(self, base: int) -> Segment:
        old = self._segments[-1]
        old.write_indexes()
        seg = self._new_segment(base)
        log.debug(
            "segment rolled",
            topic=self.topic,
            partition=self.partition,
            base_offset=base,
            previous_bytes=old.size,
        )
        return seg

    # -- read --------------------------------------------------------------------------------------

    def _locate(self, offset: int) -> tuple[int, int]:
        """(segment index, batch index) of the batch holding ``offset``; min <= offset < max."""
        si = bisect_right(self._bases, offset) - 1
        return si, self._segments[si].batch_index(offset)

    def plan_read(self, offset: int, max_bytes: int) -> ReadPlan | None:
        """Where the whole stored batches from the one holding ``offset`` lie, up to ``max_bytes``
        (at least one batch), found from the in-memory index: one contiguous range per segment.

        None when ``offset`` is outside ``[min_offset, max_offset)``. The plan names file
        descriptors: read it with :meth:`read_into` before the event loop runs anything else (a
        roll, retention or truncation may close them).
        """
        with self._lock:
            if self._closed or not self.min_offset <= offset < self.max_offset:
                return None
            if self._fenced and self.fenced_at(offset) is not None:
                return None
            si, bi = self._locate(offset)
            return plan_batches(self._segments, si, bi, offset, max_bytes)

    def read_into(self, plan: ReadPlan, buffer: memoryview) -> None:
        """Read ``plan`` into ``buffer`` (exactly ``plan.size`` bytes): one copy, no allocation."""
        if buffer.nbytes != plan.size:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, the plan {plan.size}")
        with self._lock:
            if self._closed:
                raise StorageError(f"{self.topic}-{self.partition}: log is closed", retriable=True)
            read_into_buffer(plan, buffer, self._dir)

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole stored batches from the one holding ``offset``, up to ``max_bytes`` (at least one)."""
        plan = self.plan_read(offset, max_bytes)
        if plan is None:
            return b""
        with self._lock:
            if self._closed:
                return b""
            return read_bytes(plan, self._dir)

    def bytes_behind(self, offset: int) -> int:
        """Bytes from the batch holding ``offset`` to the log end (how cold a read at offset is)."""
        with self._lock:
            active = self._segments[-1]
            end_byte = active.start_byte + active.size
            if offset >= self.max_offset:
                return 0
            offset = max(offset, self.min_offset)
            si, bi = self._locate(offset)
            seg = self._segments[si]
            return end_byte - (seg.start_byte + seg.positions[bi])

    def offset_for_timestamp(self, ts_ms: int) -> int:
        """First offset of the first batch with max_timestamp >= ts_ms; max_offset when none."""
        with self._lock:
            for seg in self._segments:
                if seg.max_timestamp >= ts_ms:
                    return seg.ts_offsets[bisect_left(seg.ts_values, ts_ms)]
            return self.max_offset

    # -- truncation and retention ------------------------------------------------------------------

    def truncate_to(self, offset: int, history: list[IncarnationEntry] | None = None) -> None:
        """Drop every batch at or after ``offset`` (the batch holding it too): replica divergence.

        The log end becomes the base offset of the batch holding ``offset``. At or below the log
        start the log is emptied and restarts at ``offset``. A cut begins a new incarnation at the
        new log end, or, with ``history`` (a slave following its master), adopts the master's.
        """
        with self._lock:
            self._check_writable()
            if offset >= self.max_offset:
                if history is not None:
                    begin_incarnation(self._dir, self._history, offset, "nothing to cut", history, cut=False)
                return
            if offset <= self.min_offset:
                self._reset_locked(offset, history)
                return
            si, bi = self._locate(offset)
            seg = self._segments[si]
            if offset >= seg.next_offset:
                bi = len(seg.offsets)  # in a gap after this segment: it stays whole
            new_end = seg.offsets[bi] if bi < len(seg.offsets) else seg.next_offset
            begin_incarnation(self._dir, self._history, new_end, "truncation", history)
            for victim in reversed(self._segments[si + 1 :]):
                os.close(victim.fd)
                self._dir.unlink_segment_files(victim.path)
            del self._segments[si + 1 :]
            del self._bases[si + 1 :]
            new_size = seg.positions[bi] if bi < len(seg.positions) else seg.size
            log.warning(
                "truncating log",
                topic=self.topic,
                partition=self.partition,
                to=new_end,
                requested=offset,
                bytes=seg.size - new_size,
            )
            self._dir.cut_segment(seg, bi)
            self._sync_truncation(seg)
            self._fenced.refresh(self._segments)

    def truncate_fully_and_start_at(self, offset: int, history: list[IncarnationEntry] | None = None) -> None:
        """Drop the whole log and restart it empty at ``offset`` (a replica behind the master's
        start): a new incarnation at ``offset``, or the master's ``history`` adopted."""
        if offset < 0:
            raise StorageError(f"negative offset {offset}", retriable=False)
        with self._lock:
            self._check_writable()
            self._reset_locked(offset, history)

    def _reset_locked(self, offset: int, history: list[IncarnationEntry] | None) -> None:
        begin_incarnation(self._dir, self._history, offset, "log reset", history)
        log.warning(
            "resetting log",
            topic=self.topic,
            partition=self.partition,
            start=offset,
            dropped_from=self.min_offset,
            dropped_to=self.max_offset,
        )
        old = self._segments
        for victim in old:
            os.close(victim.fd)
        # create the new segment before deleting: a crash in between leaves segments that open()
        # resolves to a consistent log (an empty leading segment or a gap is dropped)
        seg = self._create_segment(offset, 0)
        self._segments, self._bases = [seg], [offset]
        for victim in old:
            if victim.base_offset != offset:
                self._dir.unlink_segment_files(victim.path)
        self._sync_truncation(seg)
        self._fenced.refresh(self._segments)

    def _sync_truncation(self, seg: Segment) -> None:
        # truncation must reach the disk before new data lands in the freed offsets
        if self._config.fsync == "never":
            self._dir_dirty = True
            return
        try:
            os.fsync(seg.fd)
            fsync_dir(self.directory)
            self._dir_dirty = False
        except OSError as exc:
            raise StorageError(
                f"{self.topic}-{self.partition}: fsync failed: {exc}", retriable=False
            ) from exc

    def apply_retention(self, now_ms: int) -> int:
        """Delete closed segments past retention_ms or beyond retention_bytes; returns how many."""
        retention_ms = self._config.retention_ms
        retention_bytes = self._config.retention_bytes
        if retention_ms < 0 and retention_bytes < 0:
            return 0
        deleted = 0
        with self._lock:
            if self._closed:
                return 0
            total = self.size_bytes
            while len(self._segments) > 1:
                seg = self._segments[0]
                too_old = retention_ms >= 0 and seg.max_timestamp < now_ms - retention_ms
                too_big = retention_bytes >= 0 and total > retention_bytes
                if not (too_old or too_big):
                    break
                os.close(seg.fd)
                self._dir.unlink_segment_files(seg.path)
                del self._segments[0]
                del self._bases[0]
                total -= seg.size
                deleted += 1
                self._dir_dirty = True
                log.info(
                    "segment deleted by retention",
                    topic=self.topic,
                    partition=self.partition,
                    segment=seg.path.name,
                    bytes=seg.size,
                    reason="age" if too_old else "size",
                    min_offset=self.min_offset,
                )
            if deleted and self._fenced:
                self._fenced.refresh(self._segments)
        return deleted

    # -- durability and shutdown -------------------------------------------------------------------

    def flush(self) -> None:
        """fsync everything written so far; safe from a worker thread while the loop appends."""
        with self._lock:
            if self._closed:
                return
            fds = [os.dup(seg.fd) for seg in self._segments if seg.dirty]
            for seg in self._segments:
                seg.dirty = False
            sync_dir, self._dir_dirty = self._dir_dirty, False
        error: OSError | None = None
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError as exc:
                error = error or exc
            finally:
                os.close(fd)
        if sync_dir and error is None:
            try:
                fsync_dir(self.directory)
            except OSError as exc:
                error = exc
        if error is not None:
            self._disk.note_error(error, "fsync")  # a worker thread: the next health call probes
            raise StorageError(
                f"{self.topic}-{self.partition}: fsync failed: {error}", retriable=False
            ) from error

    def close(self) -> None:
        """Flush (unless fsync = never) and close every fd. Idempotent."""
        if self._closed:
            return
        try:
            if self._config.fsync != "never" and self._failed is None:
                self.flush()
        finally:
            with self._lock:
                self._closed = True
                self._close_fds()

    def _close_fds(self) -> None:
        for seg in self._segments:
            try:
                os.close(seg.fd)
            except OSError:
                pass


class Storage:
    """Every partition log of one broker node under ``<data_dir>/logs``."""

    def __init__(
        self, data_dir: Path, config: StorageConfig, *, new_incarnation_after_crash: bool = True
    ) -> None:
        if config.segment_bytes > MAX_SEGMENT_BYTES:
            raise StorageError(
                f"segment_bytes {config.segment_bytes} exceeds {MAX_SEGMENT_BYTES}", retriable=False
            )
        self.data_dir = Path(data_dir)
        self.logs_dir = self.data_dir / "logs"
        self.config = config
        self.disk = DiskHealth(self.data_dir)  # shared by every log: one data dir, one disk
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._lock_fd: int | None = None
        self._closed = False
        # a crash may have lost unflushed records that were served: their offsets get reused
        self._after_crash_new = new_incarnation_after_crash and config.fsync != "always"
        self.clean_start: bool | None = None  # known at the first open: the last close was clean

    def open(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Create or recover the logs of ``partitions`` (blocking). May be called again to add more."""
        if self._closed:
            raise StorageError("storage is closed", retriable=False)
        if self._lock_fd is None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.logs_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                raise StorageError(f"{self.logs_dir} is in use by another process", retriable=False) from exc
            self._lock_fd = fd
            marker = self.logs_dir / CLEAN_SHUTDOWN_FILE
            self.clean_start = marker.exists()
            if self.clean_start:
                # gone for good before anything is written: a crash from now on is unclean
                marker.unlink()
                fsync_dir(self.logs_dir)
        for topic, partition in partitions:
            if (topic, partition) in self._logs:
                continue
            if topic_name_problem(topic) is not None or partition < 0:
                raise StorageError(f"invalid partition {topic!r}/{partition}", retriable=False)
            plog = PartitionLog(
                topic, partition, self.logs_dir / f"{topic}-{partition}", self.config, self.disk
            )
            plog.open(after_crash=self._after_crash_new and not self.clean_start)
            self._logs[(topic, partition)] = plog

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def logs(self) -> Iterator[PartitionLog]:
        return iter(list(self._logs.values()))

    def fenced(self) -> list[tuple[str, int, int, int]]:
        """Every fenced range of this node: ``(topic, partition, first, last)`` (health, stats)."""
        return [(plog.topic, plog.partition, a, b) for plog in self.logs() for a, b in plog.fenced_ranges()]

    def flush_all(self) -> None:
        """fsync every log (the server calls this from a worker thread every fsync_interval_ms)."""
        error: StorageError | None = None
        for plog in list(self._logs.values()):
            try:
                plog.flush()
            except StorageError as exc:
                log.error("flush failed", topic=plog.topic, partition=plog.partition, error=str(exc))
                error = error or exc
        if error is not None:
            raise error

    def apply_retention(self, now_ms: int) -> None:
        for plog in list(self._logs.values()):
            plog.apply_retention(now_ms)

    def close(self) -> None:
        """Flush and close every log and release the directory lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            clean = self._lock_fd is not None
            for plog in self._logs.values():
                try:
                    if self.config.fsync == "never":
                        plog.flush()  # once, at shutdown: the clean marker must not outrun the data
                    plog.close()
                except StorageError as exc:
                    clean = False
                    log.error(
                        "closing log failed", topic=plog.topic, partition=plog.partition, error=str(exc)
                    )
            if clean:
                try:
                    atomic_write(self.logs_dir / CLEAN_SHUTDOWN_FILE, b"")
                except OSError as exc:
                    log.error("could not record a clean shutdown", error=str(exc))
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


__all__ = [
    "FENCED_FILE",
    "MAX_SEGMENT_BYTES",
    "PartitionLog",
    "ReadPlan",
    "ScrubView",
    "Storage",
    "StorageError",
]
