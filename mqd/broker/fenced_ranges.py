"""A log's fenced ranges: derived from its segments, recorded in ``fenced.json``, looked up, and filled.

A fenced range is offsets the log cannot serve (storage.py): a hole in a segment (damaged bytes,
:class:`mqd.broker.segment.Hole`) or a gap between two segments (a closed segment cut short or lost).
:class:`FencedRanges` derives them from the segments after every change, logs what appeared and what
went, and records them durably in the partition folder's ``fenced.json`` (for people and restarts);
fetches look them up (:meth:`FencedRanges.at`) to answer DATA_LOST.

:func:`fill_fenced` puts a replica's intact batches (read by fenced_repair.py, verbatim, offsets kept)
in place of one fenced range on disk: a hole is replaced by rewriting its segment (a new file renamed
over it; the loader removes one left by a crash), a gap becomes a new closed segment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from bisect import bisect_right

import structlog

from mqd.broker.log_dir import REPAIR_SUFFIX, LogDir, StorageError, write_all
from mqd.broker.segment import Hole, Segment
from mqd.fsutil import atomic_write, fsync_dir
from mqd.wire.format import BatchInfo

log = structlog.get_logger("mqd.broker.storage")  # the log's lines, wherever they are written

FENCED_FILE = "fenced.json"  # per partition folder: the fenced offset ranges, for people and restarts


class FencedRanges:
    """The fenced offset ranges ``(first, last)`` (inclusive) of one log, in offset order."""

    def __init__(self, log_dir: LogDir) -> None:
        self._dir = log_dir
        self._ranges: list[tuple[int, int]] = []
        self._firsts: list[int] = []  # first offset of every range, for bisect

    def __bool__(self) -> bool:
        return bool(self._ranges)

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The ranges themselves (read-only: the log changes them through :meth:`refresh`)."""
        return self._ranges

    def at(self, offset: int) -> tuple[int, int] | None:
        """The fenced range ``(first, last)`` (inclusive) holding ``offset``, or None."""
        if not self._ranges:
            return None
        i = bisect_right(self._firsts, offset) - 1
        if i >= 0 and offset <= self._ranges[i][1]:
            return self._ranges[i]
        return None

    def fence_batch(self, segments: list[Segment], seg: Segment, i: int, why: str) -> tuple[int, int]:
        """Fence batch entry ``i`` of closed segment ``seg`` (one of ``segments``), found damaged
        after open (scrub.py): it becomes a hole, an error line names it, the record notes it. The
        segment's index files go (a segment with holes is rescanned at open, which finds the damage
        again). Returns the fenced range."""
        hole = seg.fence_entry(i)
        log.error(
            "damaged batch in a closed log segment: fenced",
            topic=self._dir.topic,
            partition=self._dir.partition,
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
            self._dir.disk.note_error(exc, "index removal")
        self.refresh(segments)
        return hole.first, hole.last

    def load_record(self) -> list[tuple[int, int]]:
        """The fenced ranges recorded at the last change (empty when there is no record)."""
        try:
            doc = json.loads((self._dir.path / FENCED_FILE).read_bytes())
            return [(int(r["first"]), int(r["last"])) for r in doc["fenced"]]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            # the record is derived from the segments (rebuilt below): a damaged one is replaced
            log.warning(
                "unreadable fenced-range record: rebuilding it", path=str(self._dir.path), error=str(exc)
            )
            return [(-1, -1)]

    def refresh(self, segments: list[Segment], recorded: list[tuple[int, int]] | None = None) -> None:
        """Derive the fenced ranges from ``segments`` (their holes, the gaps between them) and
        record them durably in ``fenced.json`` when they changed (from ``recorded`` when given,
        at open: what the record said)."""
        ranges: list[tuple[int, int]] = []
        prev: Segment | None = None
        for seg in segments:
            if prev is not None and seg.base_offset > prev.next_offset:
                ranges.append((prev.next_offset, seg.base_offset - 1))
            ranges.extend((h.first, h.last) for h in seg.holes)
            prev = seg
        before = self._ranges if recorded is None else recorded
        if ranges == before:
            self._ranges, self._firsts = ranges, [r[0] for r in ranges]
            return
        topic, partition = self._dir.topic, self._dir.partition
        for first, last in sorted(set(ranges) - set(before)):
            log.error(
                "offsets fenced: damaged or missing, answered DATA_LOST until repaired",
                topic=topic,
                partition=partition,
                first_offset=first,
                last_offset=last,
                count=last - first + 1,
            )
        for first, last in sorted(set(before) - set(ranges)):
            if first >= 0:
                log.info(
                    "fenced range gone (repaired, truncated or deleted by retention)",
                    topic=topic,
                    partition=partition,
                    first_offset=first,
                    last_offset=last,
                )
        doc = {"format": 1, "fenced": [{"first": a, "last": b} for a, b in ranges]}
        try:
            atomic_write(self._dir.path / FENCED_FILE, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:
            raise self._dir.disk_error(exc, "fenced-range record write") from exc
        self._ranges, self._firsts = ranges, [r[0] for r in ranges]


@dataclasses.dataclass(frozen=True, slots=True)
class FillTarget:
    """The fenced range ``first..last`` a replica's batches fill (:func:`fill_target`): a hole of
    segment ``index``, or (``hole`` None) the gap after it."""

    first: int
    last: int
    index: int
    hole: Hole | None


class FillReadBack(StorageError):
    """A rewritten segment did not read back intact: the log must take no more writes (``reason``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, retriable=False)
        self.reason = reason


def fill_target(
    log_dir: LogDir, segments: list[Segment], fenced: FencedRanges, infos: list[BatchInfo]
) -> FillTarget:
    """Where batches ``infos`` go: the fenced range they cover exactly, from their first offset to
    the end of their last batch; StorageError when they do not (not contiguous, not one whole range)."""
    first = infos[0].base_offset
    found = fenced.at(first)
    expected = first
    for info in infos:
        if info.base_offset != expected:
            expected = -1
            break
        expected = info.next_offset
    if found is None or found[0] != first or expected != found[1] + 1:
        raise StorageError(
            f"{log_dir.topic}-{log_dir.partition}: batches {first}..{expected - 1} do not cover exactly "
            f"a fenced range (fenced: {fenced.ranges})",
            retriable=False,
        )
    si = bisect_right([s.base_offset for s in segments], first) - 1
    return FillTarget(found[0], found[1], si, segments[si].hole_at(first))


def fill_fenced(
    log_dir: LogDir, segments: list[Segment], fenced: FencedRanges, target: FillTarget, data: bytes
) -> None:
    """Put ``data`` (the batches :func:`fill_target` placed) in place of ``target`` in ``segments``
    (changed in place), durably, and record the range as no longer fenced. A disk error is a
    StorageError; FillReadBack when the rewritten segment does not read back intact (it is in
    ``segments`` then)."""
    try:
        if target.hole is None:
            _fill_gap(log_dir, segments, target.index, data)
        else:
            _rewrite_hole(log_dir, segments, fenced, target.index, target.hole, data)
    except OSError as exc:
        raise log_dir.disk_error(exc, "repair") from exc
    start_byte = 0
    for seg in segments:
        seg.start_byte = start_byte
        start_byte += seg.size
    log.warning(
        "fenced range repaired from a replica",
        topic=log_dir.topic,
        partition=log_dir.partition,
        first_offset=target.first,
        last_offset=target.last,
        bytes=len(data),
    )
    fenced.refresh(segments)


def _fill_gap(log_dir: LogDir, segments: list[Segment], si: int, data: bytes) -> None:
    """A new closed segment holding ``data`` in the gap after segment ``si``."""
    base = segments[si].next_offset
    seg = log_dir.create_segment(base, 0)
    write_all(seg.fd, data)
    os.fsync(seg.fd)
    seg.size = len(data)
    seg.scan(segments[si + 1].base_offset)
    seg.write_indexes()
    segments.insert(si + 1, seg)
    fsync_dir(log_dir.path)


def _rewrite_hole(
    log_dir: LogDir, segments: list[Segment], fenced: FencedRanges, si: int, hole: Hole, data: bytes
) -> None:
    """Segment ``si`` again with ``data`` in place of ``hole``."""
    old = segments[si]
    first = hole.first
    last = si == len(segments) - 1
    # holes copied from a master at the end of the active segment have no bytes to be found by
    trailing = [h for h in old.holes if h.first > first and h.start == h.end == old.size] if last else []
    tmp = old.path.with_name(f".{old.path.name}{REPAIR_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, os.pread(old.fd, hole.start, 0))
        write_all(fd, data)
        write_all(fd, os.pread(old.fd, old.size - hole.end, hole.end))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, old.path)
    fsync_dir(log_dir.path)
    os.close(old.fd)
    seg = log_dir.open_segment(old.path, old.base_offset, old.start_byte)
    segments[si] = seg
    next_base = None if last else segments[si + 1].base_offset
    valid = seg.scan(next_base, fenced.ranges)
    if valid < seg.size:
        # the bytes were checked before: only a disk returning other bytes gets here
        reason = f"repaired segment {old.path.name} does not read back intact"
        raise FillReadBack(f"{log_dir.topic}-{log_dir.partition}: {reason}", reason)
    if next_base is not None and seg.next_offset < next_base:
        seg.add_hole(seg.next_offset, next_base - 1, seg.size, seg.size)
    for h in trailing:
        if h.first == seg.next_offset:
            seg.add_hole(h.first, h.last, seg.size, seg.size)
    if not last:
        seg.write_indexes()
    else:
        seg.remove_indexes()
