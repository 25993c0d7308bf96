"""Reading a partition log's whole batches: where they lie in its segment files, and the reads.

A fetch reads through a :class:`ReadPlan` (:func:`plan_batches`, from the in-memory indexes: byte
ranges of whole batches from the one holding an offset, up to a byte budget, never across a hole or
a gap between segments), into the caller's buffer (:func:`read_into_buffer`, one copy) or as bytes
(:func:`read_bytes`); the background scrub (scrub.py) reads a closed segment through a
:class:`ScrubView` (every batch entry but the holes, :func:`scrub_entries`). The log (storage.py)
holds its lock around these, checks the offset and makes the view's fd.
"""

from __future__ import annotations

import dataclasses
import os
from bisect import bisect_left, bisect_right

from mqd.broker.log_dir import LogDir, StorageError
from mqd.broker.segment import Segment


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


def plan_batches(segments: list[Segment], si: int, bi: int, offset: int, max_bytes: int) -> ReadPlan | None:
    """The plan from batch ``bi`` of segment ``si`` (the one holding ``offset``, which is readable),
    up to ``max_bytes`` (at least one batch): one contiguous range per segment; None when nothing
    there can be read."""
    ranges: list[tuple[int, int, int]] = []  # (fd, position, length)
    budget = max_bytes
    next_offset = offset
    while si < len(segments):
        seg = segments[si]
        start = seg.positions[bi] if bi < len(seg.positions) else seg.size
        # a read never crosses a hole: it ends where the first one after this batch begins
        seg_end = seg.readable_end(seg.offsets[bi]) if seg.holes and bi < len(seg.offsets) else seg.size
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
        if nxt < len(segments) and segments[nxt].base_offset != seg.next_offset:
            break  # a gap between segments: fenced
        si, bi = nxt, 0
    return ReadPlan(ranges, next_offset) if ranges else None


def read_into_buffer(plan: ReadPlan, buffer: memoryview, log_dir: LogDir) -> None:
    """Read ``plan`` into ``buffer`` (exactly ``plan.size`` bytes, checked by the caller): one copy,
    no allocation. StorageError when a file holds less than planned."""
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
                f"{log_dir.topic}-{log_dir.partition}: short read at {pos} (file changed underneath)",
                retriable=False,
            )
        at += length


def read_bytes(plan: ReadPlan, log_dir: LogDir) -> bytes:
    """``plan``'s batches as bytes; StorageError on a short read."""
    chunks = []
    for fd, pos, length in plan.ranges:
        chunk = os.pread(fd, length, pos)
        if len(chunk) != length:
            raise StorageError(
                f"{log_dir.topic}-{log_dir.partition}: short read at {pos} (file changed underneath)",
                retriable=False,
            )
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def scrub_entries(seg: Segment) -> list[tuple[int, int, int, int]]:
    """Every batch entry ``(first offset, last offset, start, end)`` of ``seg`` in file order, holes
    (already fenced) left out."""
    holes = {h.first for h in seg.holes}
    offsets, n = seg.offsets, len(seg.offsets)
    return [
        (
            offsets[i],
            (offsets[i + 1] if i + 1 < n else seg.next_offset) - 1,
            seg.positions[i],
            seg.batch_end(i),
        )
        for i in range(n)
        if offsets[i] not in holes
    ]
