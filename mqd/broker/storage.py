"""Broker storage: one append-only log of record batches per partition, in segment files.

Layout: ``<data_dir>/logs/<topic>-<partition>/<base_offset:020d>.log|.index|.timeindex``. One
segment (its log file and its offset and timestamp indexes) is :class:`mqd.broker.segment.Segment`;
this file holds the partition log over its segments (appends and rolls, read plans, recovery on
open, truncation, retention, the fsync policy) and the set of logs of a node (:class:`Storage`).

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
import errno
import fcntl
import json
import os
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import structlog

from mqd.broker.disk_health import DISK_ERRNOS, DiskHealth
from mqd.broker.incarnation import IncarnationEntry, IncarnationError, IncarnationHistory
from mqd.broker.segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, Segment, segment_name
from mqd.config import StorageConfig
from mqd.errors import MqdError
from mqd.format import BatchInfo, set_base_offset
from mqd.fsutil import atomic_write, fsync_dir
from mqd.topic_name import topic_name_problem

log = structlog.get_logger(__name__)

LOCK_FILE = ".lock"
REPAIR_SUFFIX = ".repair"  # a segment being rewritten by repair_fenced, renamed over it when done
FENCED_FILE = "fenced.json"
# in <data_dir>/logs, written by a clean close, removed at open: its absence means a crash
CLEAN_SHUTDOWN_FILE = (
    ".clean_shutdown"  # per partition folder: the fenced offset ranges, for people and restarts
)
_U32_MAX = 2**32 - 1
# positions are u32 in the index file; keep every segment well inside that
MAX_SEGMENT_BYTES = 2**31


class StorageError(MqdError):
    """A log cannot be read or written, or an append breaks the log's offset rules."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message, retriable=retriable)


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


class ReadPlan:
    """Byte ranges of whole batches to read (:meth:`PartitionLog.plan_read`) and the offset after
    the last of them."""

    __slots__ = ("next_offset", "ranges", "size")

    def __init__(self, ranges: list[tuple[int, int, int]], next_offset: int) -> None:
        self.ranges = ranges  # (fd, file position, length), in log order
        self.size = sum(length for _, _, length in ranges)
        self.next_offset = next_offset


@dataclasses.dataclass(frozen=True, slots=True)
class ScrubView:
    """A closed segment as the scrub reads it (:meth:`PartitionLog.scrub_view`): its own fd (a dup:
    retention, repair or close may close the segment's meanwhile; the caller closes this one) and
    every batch entry ``(first offset, last offset, start, end)`` in file order; holes (already
    fenced) are left out."""

    segment: Segment  # identity: fence_damaged acts only while this object is still in the log
    fd: int
    size: int
    entries: list[tuple[int, int, int, int]]


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
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offset of every segment, for bisect
        self._lock = threading.Lock()
        self._dir_dirty = False
        self._closed = False
        self._failed: str | None = None  # set when a failed write could not be undone
        self._history = IncarnationHistory(directory)
        # offset ranges (first, last) this log cannot serve: holes in segments and gaps between them
        self._fenced: list[tuple[int, int]] = []
        self._fenced_firsts: list[int] = []
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
            self._begin_incarnation(self.max_offset, why)

    def _begin_incarnation(
        self, base: int, why: str, history: list[IncarnationEntry] | None = None, *, cut: bool = True
    ) -> None:
        """Start a new incarnation at ``base`` (or adopt a master's ``history``) before a cut;
        ``cut`` False for a log created or upgraded (nothing served is affected: an info line)."""
        if history is not None and history == self._history.entries:
            return  # already the master's: nothing to write or say
        before = self._history.current if self._history.entries else None
        try:
            if history is None:
                self._history.begin_new(base)
            else:
                self._history.adopt(history)
        except OSError as exc:
            raise self._disk_error(exc, "history write") from exc
        (log.warning if cut else log.info)(
            "new log incarnation" if history is None else "adopted the master's incarnation history",
            topic=self.topic,
            partition=self.partition,
            incarnation=self._history.current,
            base=self._history.current_base,
            previous=before,
            why=why,
        )

    # -- fenced ranges -----------------------------------------------------------------------------

    def fenced_ranges(self) -> list[tuple[int, int]]:
        """Offset ranges ``(first, last)`` (inclusive) this log cannot serve, in offset order: damaged
        bytes no replica repaired, offsets missing between segments. Fetches answer DATA_LOST there."""
        return list(self._fenced)

    def fenced_at(self, offset: int) -> tuple[int, int] | None:
        """The fenced range ``(first, last)`` (inclusive) holding ``offset``, or None."""
        if not self._fenced:
            return None
        i = bisect_right(self._fenced_firsts, offset) - 1
        if i >= 0 and offset <= self._fenced[i][1]:
            return self._fenced[i]
        return None

    def _load_fenced(self) -> list[tuple[int, int]]:
        """The fenced ranges recorded at the last change (empty when there is no record)."""
        try:
            doc = json.loads((self.directory / FENCED_FILE).read_bytes())
            return [(int(r["first"]), int(r["last"])) for r in doc["fenced"]]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            # the record is derived from the segments (rebuilt below): a damaged one is replaced
            log.warning(
                "unreadable fenced-range record: rebuilding it", path=str(self.directory), error=str(exc)
            )
            return [(-1, -1)]

    def _refresh_fenced_locked(self, recorded: list[tuple[int, int]] | None = None) -> None:
        """Derive the fenced ranges from the segments (their holes, the gaps between them) and
        record them durably in ``fenced.json`` when they changed."""
        ranges: list[tuple[int, int]] = []
        prev: Segment | None = None
        for seg in self._segments:
            if prev is not None and seg.base_offset > prev.next_offset:
                ranges.append((prev.next_offset, seg.base_offset - 1))
            ranges.extend((h.first, h.last) for h in seg.holes)
            prev = seg
        before = self._fenced if recorded is None else recorded
        if ranges == before:
            self._fenced, self._fenced_firsts = ranges, [r[0] for r in ranges]
            return
        for first, last in sorted(set(ranges) - set(before)):
            log.error(
                "offsets fenced: damaged or missing, answered DATA_LOST until repaired",
                topic=self.topic,
                partition=self.partition,
                first_offset=first,
                last_offset=last,
                count=last - first + 1,
            )
        for first, last in sorted(set(before) - set(ranges)):
            if first >= 0:
                log.info(
                    "fenced range gone (repaired, truncated or deleted by retention)",
                    topic=self.topic,
                    partition=self.partition,
                    first_offset=first,
                    last_offset=last,
                )
        doc = {"format": 1, "fenced": [{"first": a, "last": b} for a, b in ranges]}
        try:
            atomic_write(self.directory / FENCED_FILE, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:
            raise self._disk_error(exc, "fenced-range record write") from exc
        self._fenced, self._fenced_firsts = ranges, [r[0] for r in ranges]

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
            holes = {h.first for h in seg.holes}
            offsets, n = seg.offsets, len(seg.offsets)
            entries = [
                (
                    offsets[i],
                    (offsets[i + 1] if i + 1 < n else seg.next_offset) - 1,
                    seg.positions[i],
                    seg.batch_end(i),
                )
                for i in range(n)
                if offsets[i] not in holes
            ]
            return ScrubView(seg, os.dup(seg.fd), seg.size, entries)

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
            hole = seg.fence_entry(i)
            log.error(
                "damaged batch in a closed log segment: fenced",
                topic=self.topic,
                partition=self.partition,
                segment=seg.path.name,
                first_offset=hole.first,
                last_offset=hole.last,
                byte_start=hole.start,
                byte_end=hole.end,
                why=why,
            )
            try:
                seg.remove_indexes()
            except OSError as exc:
                # the hole holds in memory; a trusted index at the next open hides it until the
                # scrub finds it again
                self._disk.note_error(exc, "index removal")
            self._refresh_fenced_locked()
            return hole.first, hole.last

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
            self._refresh_fenced_locked()

    def repair_fenced(self, data: bytes, infos: list[BatchInfo]) -> None:
        """Replace one fenced range with intact batches from a replica (verbatim, offsets kept):
        ``infos`` (``data``'s batches, validated by the caller) must cover exactly the range that
        starts at their first offset. A hole in a segment is replaced by rewriting that segment
        (a new file renamed over it); a gap between segments becomes a new segment. Durable on
        return; the range is no longer fenced."""
        _check_layout(data, infos)
        with self._lock:
            self._check_writable()
            first = infos[0].base_offset
            fenced = self.fenced_at(first)
            expected = first
            for info in infos:
                if info.base_offset != expected:
                    expected = -1
                    break
                expected = info.next_offset
            if fenced is None or fenced[0] != first or expected != fenced[1] + 1:
                raise StorageError(
                    f"{self.topic}-{self.partition}: batches {first}..{expected - 1} do not cover exactly "
                    f"a fenced range (fenced: {self._fenced})",
                    retriable=False,
                )
            si = bisect_right(self._bases, first) - 1
            try:
                if self._segments[si].hole_at(first) is None:
                    self._fill_gap_locked(si, data)
                else:
                    self._rewrite_hole_locked(si, first, data)
            except OSError as exc:
                raise self._disk_error(exc, "repair") from exc
            start_byte = 0
            for seg in self._segments:
                seg.start_byte = start_byte
                start_byte += seg.size
            log.warning(
                "fenced range repaired from a replica",
                topic=self.topic,
                partition=self.partition,
                first_offset=fenced[0],
                last_offset=fenced[1],
                bytes=len(data),
            )
            self._refresh_fenced_locked()

    def _fill_gap_locked(self, si: int, data: bytes) -> None:
        """A new closed segment holding ``data`` in the gap after segment ``si``."""
        base = self._segments[si].next_offset
        seg = self._create_segment(base, 0)
        self._write_all(seg.fd, data)
        os.fsync(seg.fd)
        seg.size = len(data)
        seg.scan(self._segments[si + 1].base_offset)
        seg.write_indexes()
        self._segments.insert(si + 1, seg)
        self._bases.insert(si + 1, base)
        fsync_dir(self.directory)

    def _rewrite_hole_locked(self, si: int, first: int, data: bytes) -> None:
        """Segment ``si`` again with ``data`` in place of the hole starting at ``first``."""
        old = self._segments[si]
        hole = old.hole_at(first)
        assert hole is not None
        last = si == len(self._segments) - 1
        # holes copied from a master at the end of the active segment have no bytes to be found by
        trailing = [h for h in old.holes if h.first > first and h.start == h.end == old.size] if last else []
        tmp = old.path.with_name(f".{old.path.name}{REPAIR_SUFFIX}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self._write_all(fd, os.pread(old.fd, hole.start, 0))
            self._write_all(fd, data)
            self._write_all(fd, os.pread(old.fd, old.size - hole.end, hole.end))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, old.path)
        fsync_dir(self.directory)
        os.close(old.fd)
        seg = self._open_segment(old.path, old.base_offset, old.start_byte)
        self._segments[si] = seg
        next_base = None if last else self._segments[si + 1].base_offset
        valid = seg.scan(next_base, self._fenced)
        if valid < seg.size:
            # the bytes were checked before: only a disk returning other bytes gets here
            self._failed = f"repaired segment {old.path.name} does not read back intact"
            raise StorageError(f"{self.topic}-{self.partition}: {self._failed}", retriable=False)
        if next_base is not None and seg.next_offset < next_base:
            seg.add_hole(seg.next_offset, next_base - 1, seg.size, seg.size)
        for h in trailing:
            if h.first == seg.next_offset:
                seg.add_hole(h.first, h.last, seg.size, seg.size)
        if not last:
            seg.write_indexes()
        else:
            seg.remove_indexes()

    @staticmethod
    def _write_all(fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- open / recovery ---------------------------------------------------------------------------

    def open(self, *, after_crash: bool = False) -> None:
        """Create or recover the log (blocking). ``after_crash``: the node did not close cleanly
        and appends were not each fsynced, so the tail may have lost records that were served
        (a file reverted to its last synced size shows no torn bytes): unless recovery cut
        something already, the log begins a new incarnation at its end."""
        self.directory.mkdir(parents=True, exist_ok=True)
        bases: list[int] = []
        for p in self.directory.iterdir():
            if p.name.startswith(".") and p.suffix == REPAIR_SUFFIX:
                p.unlink()  # a repair that did not finish: the segment it was to replace is intact
                continue
            if p.suffix != LOG_SUFFIX:
                continue
            try:
                bases.append(int(p.stem))
            except ValueError:
                log.warning("ignoring unexpected file in log directory", path=str(p))
        bases.sort()
        try:
            loaded = self._load_history()
            if not bases:
                # created empty, or recreated: whatever a history says named records that are gone
                self._begin_incarnation(0, "log created" if not loaded else "log files gone", cut=loaded)
            elif not loaded:
                # a log written before incarnations: every offset it holds stays valid under one id
                self._begin_incarnation(bases[0], "log written before incarnations", cut=False)
            recorded = self._load_fenced()
            history_before = self._history.entries
            self._recover(bases, recorded)
            if not self._segments:
                self._new_segment(0)
            for first, last in recorded:
                if first == self.max_offset and first >= 0:
                    # a fenced range copied from a master at the log end: no bytes to find it by
                    active = self._segments[-1]
                    active.add_hole(first, last, active.size, active.size)
            self._refresh_fenced_locked(recorded)
            if self.max_offset < self._history.current_base:
                # the files end before the current incarnation began: they were cut outside mqd
                self._begin_incarnation(self.max_offset, "log shorter than its current incarnation")
            elif after_crash and bases and self._history.entries == history_before:
                self._begin_incarnation(self.max_offset, "unclean shutdown: unflushed records may be lost")
        except BaseException:
            self._close_fds()
            raise
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

    def _load_history(self) -> bool:
        """Load the incarnation history; an unreadable one is set aside (kept for people) and the
        log gets a new incarnation: consumers then land what they read again, counted, instead of
        trusting offsets nothing vouches for, and the node still starts."""
        try:
            return self._history.load()
        except IncarnationError as exc:
            aside = self._history.path.with_name(self._history.path.name + ".damaged")
            log.error(
                "incarnation history unreadable: set aside, the log begins a new incarnation",
                topic=self.topic,
                partition=self.partition,
                error=str(exc),
                kept_as=str(aside),
            )
            os.replace(self._history.path, aside)
            return False

    def _recover(self, bases: list[int], recorded: list[tuple[int, int]]) -> None:
        bases = self._drop_empty_closed_segments(bases)
        start_byte = 0
        for i, base in enumerate(bases):
            path = self.directory / (segment_name(base) + LOG_SUFFIX)
            last = i == len(bases) - 1
            next_base = None if last else bases[i + 1]
            if self._segments and base < self._segments[-1].next_offset:
                log.warning(
                    "overlapping segments: deleting the later segments",
                    topic=self.topic,
                    partition=self.partition,
                    expected=self._segments[-1].next_offset,
                    found=base,
                    deleted=[segment_name(b) for b in bases[i:]],
                )
                self._begin_incarnation(self._segments[-1].next_offset, "recovery cut")
                for b in bases[i:]:
                    self._unlink_segment_files(self.directory / (segment_name(b) + LOG_SUFFIX))
                self._dir_dirty = True
                return
            if self._segments and base > self._segments[-1].next_offset and last and path.stat().st_size == 0:
                # an empty last segment after a gap (a crash inside a reset): it holds nothing
                log.warning(
                    "dropping an empty segment after a gap",
                    topic=self.topic,
                    partition=self.partition,
                    segment=path.name,
                    log_end=self._segments[-1].next_offset,
                )
                self._unlink_segment_files(path)
                self._dir_dirty = True
                return
            # a gap before this segment (a segment file lost) is fenced by _refresh_fenced_locked
            seg = self._open_segment(path, base, start_byte)
            if not last and seg.load_indexes():
                seg.trusted = True  # its middle batches are checked by the scrub (scrub.py)
                self.segments_trusted += 1
                self._append_segment(seg)
                start_byte += seg.size
                continue
            self.segments_scanned += 1
            valid = seg.scan(next_base, recorded)
            if valid < seg.size and last:
                log.warning(
                    "truncating torn or corrupt log tail",
                    topic=self.topic,
                    partition=self.partition,
                    segment=path.name,
                    bytes=seg.size - valid,
                    at=valid,
                    offset=seg.next_offset,
                )
                # before the cut: a crash in between leaves a new id, never the old one over a gap
                self._begin_incarnation(seg.next_offset, "recovery cut")
                os.ftruncate(seg.fd, valid)
                os.fsync(seg.fd)
                seg.size = valid
            elif next_base is not None and seg.next_offset < next_base:
                # a closed segment damaged or cut short up to its end: fence the rest of its offsets
                seg.add_hole(seg.next_offset, next_base - 1, valid, seg.size)
            elif valid < seg.size:
                # bytes after the last batch of a closed segment that stand for no offset
                log.warning(
                    "cutting bytes after the last batch of a closed segment",
                    topic=self.topic,
                    partition=self.partition,
                    segment=path.name,
                    bytes=seg.size - valid,
                    at=valid,
                )
                os.ftruncate(seg.fd, valid)
                os.fsync(seg.fd)
                seg.size = valid
            for hole in seg.holes:
                log.error(
                    "damaged range in a log segment: fenced",
                    topic=self.topic,
                    partition=self.partition,
                    segment=path.name,
                    first_offset=hole.first,
                    last_offset=hole.last,
                    byte_start=hole.start,
                    byte_end=hole.end,
                )
            if not last:
                seg.write_indexes()
            self._append_segment(seg)
            start_byte += seg.size

    def _drop_empty_closed_segments(self, bases: list[int]) -> list[int]:
        """An empty segment before others carries nothing (a crash inside a roll or a reset, or a
        file cut to nothing, whose offsets then show as a gap): drop it."""
        kept = []
        for i, base in enumerate(bases):
            path = self.directory / (segment_name(base) + LOG_SUFFIX)
            if i < len(bases) - 1 and path.stat().st_size == 0:
                self._unlink_segment_files(path)
                self._dir_dirty = True
                continue
            kept.append(base)
        return kept

    def _open_segment(self, path: Path, base: int, start_byte: int) -> Segment:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        seg = Segment(path, base, fd, start_byte)
        seg.size = os.fstat(fd).st_size
        return seg

    def _append_segment(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base_offset)

    def _new_segment(self, base: int) -> Segment:
        start_byte = self._segments[-1].start_byte + self._segments[-1].size if self._segments else 0
        seg = self._create_segment(base, start_byte)
        self._append_segment(seg)
        return seg

    def _create_segment(self, base: int, start_byte: int) -> Segment:
        path = self.directory / (segment_name(base) + LOG_SUFFIX)
        seg = self._open_segment(path, base, start_byte)
        if seg.size:
            # a leftover file under this name can only be stale: the log says nothing lives here
            os.ftruncate(seg.fd, 0)
            seg.size = 0
        seg.remove_indexes()
        self._dir_dirty = True
        return seg

    @staticmethod
    def _unlink_segment_files(log_path: Path) -> None:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            log_path.with_suffix(suffix).unlink(missing_ok=True)

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
        self._disk.note_error(exc, what)
        self._disk.probe_soon()
        retriable = exc.errno in DISK_ERRNOS and exc.errno != errno.EIO
        return StorageError(f"{self.topic}-{self.partition}: {what} failed: {exc}", retriable=retriable)

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
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(seg.fd, view[written:])
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
            ranges: list[tuple[int, int, int]] = []  # (fd, position, length)
            budget = max_bytes
            next_offset = offset
            while si < len(self._segments):
                seg = self._segments[si]
                start = seg.positions[bi] if bi < len(seg.positions) else seg.size
                # a read never crosses a hole: it ends where the first one after this batch begins
                seg_end = (
                    seg.readable_end(seg.offsets[bi]) if seg.holes and bi < len(seg.offsets) else seg.size
                )
                after = len(seg.positions)
                if start < seg_end:
                    limit = start + max(budget, 0)
                    if seg_end <= limit:
                        end = seg_end
                        after = bisect_left(seg.positions, end) if seg.holes else len(seg.positions)
                    else:
                        k = bisect_right(seg.positions, limit) - 1  # batches before k end by limit
                        if k > bi:
                            end, after = seg.positions[k], k
                        elif not ranges:
                            end, after = seg.batch_end(bi), bi + 1  # the first batch goes out whole
                        else:
                            break
                    ranges.append((seg.fd, start, end - start))
                    next_offset = seg.offsets[after] if after < len(seg.offsets) else seg.next_offset
                    budget -= end - start
                    if after < len(seg.positions) or budget <= 0:
                        break
                elif start < seg.size:
                    break  # the segment goes on with a hole right here
                nxt = si + 1
                if nxt < len(self._segments) and self._segments[nxt].base_offset != seg.next_offset:
                    break  # a gap between segments: fenced
                si, bi = nxt, 0
            return ReadPlan(ranges, next_offset) if ranges else None

    def read_into(self, plan: ReadPlan, buffer: memoryview) -> None:
        """Read ``plan`` into ``buffer`` (exactly ``plan.size`` bytes): one copy, no allocation."""
        if buffer.nbytes != plan.size:
            raise ValueError(f"buffer holds {buffer.nbytes} bytes, the plan {plan.size}")
        with self._lock:
            if self._closed:
                raise StorageError(f"{self.topic}-{self.partition}: log is closed", retriable=True)
            at = 0
            for fd, pos, length in plan.ranges:
                view = buffer[at : at + length]
                got = os.preadv(fd, [view], pos)
                while 0 < got < length:  # preadv may stop early (signals, very large reads)
                    n = os.preadv(fd, [view[got:]], pos + got)
                    if n == 0:
                        break
                    got += n
                if got != length:
                    raise StorageError(
                        f"{self.topic}-{self.partition}: short read at {pos} (file changed underneath)",
                        retriable=False,
                    )
                at += length

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole stored batches from the one holding ``offset``, up to ``max_bytes`` (at least one)."""
        plan = self.plan_read(offset, max_bytes)
        if plan is None:
            return b""
        chunks = []
        with self._lock:
            if self._closed:
                return b""
            for fd, pos, length in plan.ranges:
                chunk = os.pread(fd, length, pos)
                if len(chunk) != length:
                    raise StorageError(
                        f"{self.topic}-{self.partition}: short read at {pos} (file changed underneath)",
                        retriable=False,
                    )
                chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

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
                    self._begin_incarnation(offset, "nothing to cut", history, cut=False)
                return
            if offset <= self.min_offset:
                self._reset_locked(offset, history)
                return
            si, bi = self._locate(offset)
            seg = self._segments[si]
            if offset >= seg.next_offset:
                bi = len(seg.offsets)  # in a gap after this segment: it stays whole
            new_end = seg.offsets[bi] if bi < len(seg.offsets) else seg.next_offset
            self._begin_incarnation(new_end, "truncation", history)
            for victim in reversed(self._segments[si + 1 :]):
                os.close(victim.fd)
                self._unlink_segment_files(victim.path)
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
            os.ftruncate(seg.fd, new_size)
            seg.size = new_size
            del seg.offsets[bi:]
            del seg.positions[bi:]
            ti = bisect_left(seg.ts_offsets, new_end)
            del seg.ts_offsets[ti:]
            del seg.ts_values[ti:]
            seg.holes = [h for h in seg.holes if h.first < new_end]
            seg.next_offset = new_end
            seg.remove_indexes()  # it is the active segment again: its index is rebuilt on open
            self._sync_truncation(seg)
            self._refresh_fenced_locked()

    def truncate_fully_and_start_at(self, offset: int, history: list[IncarnationEntry] | None = None) -> None:
        """Drop the whole log and restart it empty at ``offset`` (a replica behind the master's
        start): a new incarnation at ``offset``, or the master's ``history`` adopted."""
        if offset < 0:
            raise StorageError(f"negative offset {offset}", retriable=False)
        with self._lock:
            self._check_writable()
            self._reset_locked(offset, history)

    def _reset_locked(self, offset: int, history: list[IncarnationEntry] | None) -> None:
        self._begin_incarnation(offset, "log reset", history)
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
                self._unlink_segment_files(victim.path)
        self._sync_truncation(seg)
        self._refresh_fenced_locked()

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
                self._unlink_segment_files(seg.path)
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
                self._refresh_fenced_locked()
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


__all__ = ["MAX_SEGMENT_BYTES", "PartitionLog", "ReadPlan", "ScrubView", "Storage", "StorageError"]
