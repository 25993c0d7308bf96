"""One segment of a partition log: its ``.log`` file and its two indexes, on disk and in memory.

- ``.log``: batches exactly as they go on the wire (format.py).
- ``.index``: one entry per batch, ``(relative offset u32, position u32)``.
- ``.timeindex``: ``(max_timestamp i64, relative offset u32)``, an entry each time the segment's
  largest timestamp grows, so the first entry with ``ts >= T`` names the first batch reaching ``T``.

The indexes are derived data, kept in memory (``array``, lookups are a bisect) and written when the
segment is rolled. :meth:`Segment.load_indexes` trusts index files only when they agree with the
log file (their own invariants, and the first and last indexed batches read back intact where the
index puts them, the last one ending at the file end), so a closed segment opens in O(index size);
:meth:`Segment.scan` rebuilds them from the log with CRC checks. What to do with a torn
tail (recovery) and when to roll is the partition log's business (storage.py).

A segment may hold *holes* (issue 12): offsets it cannot serve. A damaged byte range (a batch
whose CRC fails, with intact batches after it) or offsets missing between two intact batches.
:meth:`Segment.scan` does not stop at the first damaged batch: it resynchronises on the next intact
batch (a magic at an 8-byte boundary whose header and CRC check out and whose offsets continue the
segment) and records what lies between as a hole. A hole is an entry of the offset index too (its
first offset at its first byte), so the batch before it ends where the hole begins and a lookup
inside it lands on it; ``holes`` says which entries are holes. A segment with holes never writes
index files: it is rescanned at every open, so the holes are found again from the bytes.

A trusted index proves only the first and last batches, so a closed segment opened that way is
``trusted`` until the background scrub (scrub.py) has checked every batch; a batch it finds damaged
becomes a hole in place (:meth:`Segment.fence_entry`), exactly as a rescan would record it.
"""

from __future__ import annotations

import mmap
import os
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mqd.wire.format import (
    HEADER_SIZE,
    MAGIC,
    BatchError,
    BatchInfo,
    check_crc,
    read_header,
    scan_valid_prefix,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
_INDEX_DTYPE = np.dtype([("rel", "<u4"), ("pos", "<u4")])
_TIMEINDEX_DTYPE = np.dtype([("ts", "<i8"), ("rel", "<u4")])
NO_TIMESTAMP = -(2**63)
_ALIGN = 8  # every batch starts at a multiple of 8 in its segment (lengths are multiples of 8)


class Hole:
    """Offsets ``first..last`` (inclusive) a segment cannot serve, lying in bytes ``[start, end)``
    of its file (``start == end``: the offsets are missing, no bytes stand for them)."""

    __slots__ = ("end", "first", "last", "start")

    def __init__(self, first: int, last: int, start: int, end: int) -> None:
        self.first, self.last, self.start, self.end = first, last, start, end

    def __repr__(self) -> str:
        return f"Hole({self.first}..{self.last}, bytes [{self.start}, {self.end}))"


def segment_name(base_offset: int) -> str:
    """The file name (without suffix) of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


class Segment:
    """One segment file and its in-memory indexes (absolute offsets, positions in the file)."""

    __slots__ = (
        "base_offset",
        "dirty",
        "fd",
        "holes",
        "next_offset",
        "offsets",
        "path",
        "positions",
        "size",
        "start_byte",
        "trusted",
        "ts_offsets",
        "ts_values",
    )

    def __init__(self, path: Path, base_offset: int, fd: int, start_byte: int) -> None:
        self.path = path  # the .log file
        self.base_offset = base_offset
        self.fd = fd
        self.size = 0
        self.start_byte = start_byte  # byte position of this segment in the partition's whole log
        self.next_offset = base_offset
        self.offsets = array("q")  # base offset of every batch
        self.positions = array("q")  # file position of every batch
        self.ts_values = array("q")  # strictly increasing max timestamps
        self.ts_offsets = array("q")  # base offset of the batch where the max grew
        self.holes: list[Hole] = []  # in offset order; each also has an entry in offsets/positions
        self.dirty = False  # written since the last fsync
        self.trusted = False  # opened from its index files: middle batches not CRC-checked yet

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)

    @property
    def timeindex_path(self) -> Path:
        return self.path.with_suffix(TIMEINDEX_SUFFIX)

    @property
    def max_timestamp(self) -> int:
        return self.ts_values[-1] if self.ts_values else NO_TIMESTAMP

    def add_batch(self, base_offset: int, count: int, position: int, max_timestamp: int) -> None:
        self.offsets.append(base_offset)
        self.positions.append(position)
        if max_timestamp > self.max_timestamp:
            self.ts_values.append(max_timestamp)
            self.ts_offsets.append(base_offset)
        self.next_offset = base_offset + count

    def add_hole(self, first: int, last: int, start: int, end: int) -> None:
        """Record offsets ``first..last`` as a hole over bytes ``[start, end)``: the next entry
        (batch or hole) starts at ``end``, at offset ``last + 1``."""
        self.offsets.append(first)
        self.positions.append(start)
        self.holes.append(Hole(first, last, start, end))
        self.next_offset = last + 1

    def fence_entry(self, i: int) -> Hole:
        """Make batch entry ``i`` a hole over its own bytes (damage found after open, scrub.py):
        its offsets up to the next entry's are fenced, a read stops before it."""
        first = self.offsets[i]
        last = (self.offsets[i + 1] if i + 1 < len(self.offsets) else self.next_offset) - 1
        hole = Hole(first, last, self.positions[i], self.batch_end(i))
        at = next((k for k, h in enumerate(self.holes) if h.first > first), len(self.holes))
        self.holes.insert(at, hole)
        return hole

    def hole_at(self, offset: int) -> Hole | None:
        for hole in self.holes:
            if hole.first <= offset <= hole.last:
                return hole
        return None

    def readable_end(self, offset: int) -> int:
        """The end of the bytes that may be read in one piece from the entry holding ``offset``:
        where the first hole at or after that offset begins, or the file end."""
        for hole in self.holes:
            if hole.last >= offset:
                return hole.start
        return self.size

    def reset_index(self) -> None:
        self.offsets = array("q")
        self.positions = array("q")
        self.ts_values = array("q")
        self.ts_offsets = array("q")
        self.holes = []
        self.next_offset = self.base_offset

    def batch_index(self, offset: int) -> int:
        """Index of the batch containing ``offset`` (the caller checks the segment holds it)."""
        return bisect_right(self.offsets, offset) - 1

    def batch_end(self, i: int) -> int:
        return self.positions[i + 1] if i + 1 < len(self.positions) else self.size

    # -- index files -------------------------------------------------------------------------------

    def write_indexes(self) -> None:
        """Write both index files from memory (a rolled segment's index is never changed again);
        a segment with holes has none (it is rescanned at open, which finds its holes again)."""
        if self.holes:
            self.remove_indexes()
            return
        index = np.empty(len(self.offsets), dtype=_INDEX_DTYPE)
        index["rel"] = np.frombuffer(self.offsets, dtype=np.int64) - self.base_offset
        index["pos"] = np.frombuffer(self.positions, dtype=np.int64)
        tindex = np.empty(len(self.ts_values), dtype=_TIMEINDEX_DTYPE)
        tindex["ts"] = np.frombuffer(self.ts_values, dtype=np.int64)
        tindex["rel"] = np.frombuffer(self.ts_offsets, dtype=np.int64) - self.base_offset
        for path, arr in ((self.index_path, index), (self.timeindex_path, tindex)):
            with open(path, "wb") as fh:
                fh.write(arr.tobytes())

    def remove_indexes(self) -> None:
        self.index_path.unlink(missing_ok=True)
        self.timeindex_path.unlink(missing_ok=True)

    def load_indexes(self) -> bool:
        """Load the index files when they are consistent with the log file; False otherwise."""
        try:
            raw_index = self.index_path.read_bytes()
            raw_tindex = self.timeindex_path.read_bytes()
        except OSError:
            return False
        if (
            not raw_index
            or len(raw_index) % _INDEX_DTYPE.itemsize
            or len(raw_tindex) % _TIMEINDEX_DTYPE.itemsize
        ):
            return False
        index = np.frombuffer(raw_index, dtype=_INDEX_DTYPE)
        tindex = np.frombuffer(raw_tindex, dtype=_TIMEINDEX_DTYPE)
        rel = index["rel"].astype(np.int64)
        pos = index["pos"].astype(np.int64)
        t_rel = tindex["rel"].astype(np.int64)
        t_ts = tindex["ts"]
        if (
            rel[0] != 0
            or pos[0] != 0
            or np.any(np.diff(rel) <= 0)
            or np.any(np.diff(pos) < HEADER_SIZE)
            or len(tindex) == 0
            or t_rel[0] != 0
            or np.any(np.diff(t_rel) <= 0)
            or np.any(np.diff(t_ts) <= 0)
            or t_rel[-1] > rel[-1]
            or not np.all(np.isin(t_rel, rel))
        ):
            return False
        # Cheap proof that the index describes this file (a closed segment is never written again):
        # its first and its last indexed batch, read back whole, are intact (CRC), carry the
        # indexed offsets and fill their indexed ranges, the last one up to the file end. Batches in
        # between are not re-read: that is the rescan this path exists to avoid.
        last_pos = int(pos[-1])
        first = self._read_batch(0, int(pos[1]) if len(pos) > 1 else self.size)
        info = first if len(pos) == 1 else self._read_batch(last_pos, self.size - last_pos)
        if first is None or info is None:
            return False
        if first.base_offset != self.base_offset or info.base_offset != self.base_offset + int(rel[-1]):
            return False
        if int(t_ts[0]) != first.max_timestamp:
            return False
        self.offsets = array("q", (rel + self.base_offset).tobytes())
        self.positions = array("q", pos.tobytes())
        self.ts_values = array("q", t_ts.astype(np.int64).tobytes())
        self.ts_offsets = array("q", (t_rel + self.base_offset).tobytes())
        self.next_offset = info.base_offset + info.count
        return True

    def _read_batch(self, position: int, length: int) -> BatchInfo | None:
        """The intact batch (header and CRC) filling exactly ``[position, position + length)`` of
        the file, or None when the bytes there are anything else."""
        if length < HEADER_SIZE:
            return None
        try:
            raw = os.pread(self.fd, length, position)
            info = read_header(raw, 0)
            check_crc(raw, info)
        except (OSError, BatchError):
            return None
        return info if info.length == length else None

    def scan(self, next_base: int | None = None, known: Sequence[tuple[int, int]] = ()) -> int:
        """Rebuild the indexes from the log file with CRC checks, recording holes (module doc).

        Returns where the damaged tail begins: the byte length up to the end of the last intact
        batch or hole, after which no intact batch could be found (the file size when there is no
        such tail). ``next_base``, the base offset of the next segment (None for the last one),
        bounds the offsets a batch of this segment may carry. ``known`` are the fenced ranges
        recorded before: an intact batch whose offsets jump over exactly one of them follows a
        hole with no bytes (copied from a master); any other jump is damage (the CRC does not
        cover the base offset, so a flipped bit there must not renumber records).
        """
        self.reset_index()
        if self.size == 0:
            return 0
        with mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return self._scan(mm, view, next_base, set(known))
            finally:
                view.release()

    def _scan(
        self, mm: mmap.mmap, view: memoryview, next_base: int | None, known: set[tuple[int, int]]
    ) -> int:
        pos = 0
        expected = self.base_offset
        while True:
            infos, valid = scan_valid_prefix(view[pos:])
            for info in infos:
                if (
                    info.base_offset < expected
                    or (info.base_offset > expected and (expected, info.base_offset - 1) not in known)
                    or (next_base is not None and info.next_offset > next_base)
                ):
                    valid = info.position  # offsets this segment cannot hold: damage from here
                    break
                if info.base_offset > expected:
                    # intact batches, offsets missing between them (a hole copied from a master)
                    self.add_hole(expected, info.base_offset - 1, pos + info.position, pos + info.position)
                self.add_batch(info.base_offset, info.count, pos + info.position, info.max_timestamp)
                expected = info.next_offset
            pos += valid
            if pos >= self.size:
                return pos
            found = find_intact_batch(mm, view, pos + _ALIGN, expected, next_base)
            if found is None:
                return pos
            self.add_hole(expected, found.base_offset - 1, pos, found.position)
            expected = found.base_offset
            pos = found.position


def find_intact_batch(
    buf: mmap.mmap | bytes, view: memoryview | bytes, start: int, expected: int, next_base: int | None
) -> BatchInfo | None:
    """The first intact batch (magic at an 8-byte boundary, header and CRC) at or after byte
    ``start`` of ``buf`` that may follow offset ``expected`` after a damaged range (its base is
    above ``expected`` and, with ``next_base``, it ends by then), or None. ``view`` is ``buf`` as
    read_header takes it. Used by the segment scan and by master recovery's copy-back."""
    at = start
    while True:
        at = buf.find(MAGIC, at)
        if at < 0:
            return None
        if at % _ALIGN:
            at += _ALIGN - at % _ALIGN
            continue
        try:
            info = read_header(view, at)
            check_crc(view, info)
        except BatchError:
            at += _ALIGN
            continue
        if info.base_offset > expected and (next_base is None or info.next_offset <= next_base):
            return info
        at += _ALIGN
