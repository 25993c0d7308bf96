"""The records kernel: Kafka v2 records (varint framed) into flat column buffers, many batches at once.

The compiled kernel (_rbv2.c, built by ``make install`` through setup.py, loaded with ctypes: no
Python API, no JIT) does the per-record work; where no compiler was available the same two passes run
in pure Python (the measured fallback, ~50x slower). Either way the caller gets numpy arrays, never a
Python object per record: scan() validates the framing and sizes the buffers, fill() writes them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

_HERE = Path(__file__).parent
_ERRORS = {
    -1: "a record field runs past its record",
    -2: "a negative or oversized length",
    -3: "record offset deltas not increasing or past lastOffsetDelta",
    -4: "bytes left over after a record, or records past the section end",
    -5: "fewer records than the batch header says",
    -6: "a header key is not valid UTF-8",
}
NO_TS = np.iinfo(np.int64).min  # fixed_ts entry of a CreateTime batch


class KernelError(ValueError):
    """Malformed records inside a batch whose header was fine."""

    def __init__(self, code: int, segment: int, record: int) -> None:
        super().__init__(f"record {record}: {_ERRORS.get(code, f'error {code}')}")
        self.segment = segment
        self.record = record


# the columns of the segment table (one row per records section; _rbv2.c's S_ names)
S_PTR, S_LEN, S_COUNT, S_LAST_DELTA, S_BASE_OFFSET, S_BASE_TS, S_FIXED_TS = range(7)
SEG_COLS = 7


@dataclass(slots=True)
class Segments:
    """The records sections to decode: ``table`` has one row of SEG_COLS int64 per batch (the
    address of its records section, kept alive by the caller; its length, recordsCount,
    lastOffsetDelta, baseOffset, baseTimestamp; and for LogAppendTime batches the maxTimestamp,
    else NO_TS). One array, so the kernel call passes one pointer for all of it."""

    table: npt.NDArray[np.int64]

    @classmethod
    def of(cls, rows: list[tuple[int, int, int, int, int, int, int]]) -> Segments:
        return cls(np.array(rows, dtype=np.int64).reshape(-1, SEG_COLS))

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        return self.table[:, S_COUNT]

    def __len__(self) -> int:
        return len(self.table)


# output buffers in _rbv2.c's O_ order: (name, item type, length from (records, headers, totals))
_LAYOUT: tuple[tuple[str, type[np.generic], int], ...] = (
    ("offset", np.int64, 0),
    ("ts", np.int64, 0),
    ("k_off", np.int32, 1),
    ("k_data", np.uint8, 2),
    ("k_valid", np.uint8, 0),
    ("v_off", np.int32, 1),
    ("v_data", np.uint8, 3),
    ("v_valid", np.uint8, 0),
    ("h_off", np.int32, 1),
    ("hk_off", np.int32, 5),
    ("hk_data", np.uint8, 6),
    ("hv_off", np.int32, 5),
    ("hv_data", np.uint8, 7),
    ("hv_valid", np.uint8, 4),
)
_ALIGN = 64  # Arrow's preferred buffer alignment


@dataclass(slots=True)
class Columns:
    """Output buffers, views into one allocation; validity arrays are one byte per entry
    (1 = present)."""

    offset: npt.NDArray[np.int64]
    ts: npt.NDArray[np.int64]
    k_off: npt.NDArray[np.int32]
    k_data: npt.NDArray[np.uint8]
    k_valid: npt.NDArray[np.uint8]
    v_off: npt.NDArray[np.int32]
    v_data: npt.NDArray[np.uint8]
    v_valid: npt.NDArray[np.uint8]
    h_off: npt.NDArray[np.int32]
    hk_off: npt.NDArray[np.int32]
    hk_data: npt.NDArray[np.uint8]
    hv_off: npt.NDArray[np.int32]
    hv_data: npt.NDArray[np.uint8]
    hv_valid: npt.NDArray[np.uint8]
    null_keys: int
    null_values: int
    null_header_values: int
    addresses: npt.NDArray[np.uint64]  # of the buffers above, in their order (rbv2_fill's ``out``)
    # the one allocation every buffer above is a view of: it lives while any Arrow buffer made from
    # them does, so the byte budget tracks the decoded records by it (mqd.consumer.source.Decoded.held)
    arena: npt.NDArray[np.uint8]

    @classmethod
    def allocate(cls, t: list[int]) -> Columns:
        """One allocation for every buffer (one address to ask numpy for, not fourteen: at small
        answers the per-call cost is what counts), each buffer 64-byte aligned."""
        n, h = t[8], t[2]
        lengths = (n, n + 1, t[0], t[1], h, h + 1, t[3], t[4])  # indexed by _LAYOUT's third field
        sizes = [lengths[k] * np.dtype(dt).itemsize for _, dt, k in _LAYOUT]
        starts = []
        pos = 0
        for size in sizes:
            starts.append(pos)
            pos += -(-size // _ALIGN) * _ALIGN
        # from Arrow's pool, as every other buffer of the records' life (the landing's encoder)
        arena = np.frombuffer(pa.allocate_buffer(pos + _ALIGN), np.uint8)
        base = arena.ctypes.data
        skew = -base % _ALIGN
        views = [
            arena[skew + o : skew + o + size].view(dt)
            for o, size, (_, dt, _) in zip(starts, sizes, _LAYOUT, strict=True)
        ]
        addresses = np.array([base + skew + o for o in starts], dtype=np.uint64)
        (
            o,
            ts,
            k_off,
            k_data,
            k_valid,
            v_off,
            v_data,
            v_valid,
            h_off,
            hk_off,
            hk_data,
            hv_off,
            hv_data,
            hv_valid,
        ) = views
        return cls(
            o, ts, k_off, k_data, k_valid, v_off, v_data, v_valid, h_off,
            hk_off, hk_data, hv_off, hv_data, hv_valid, t[5], t[6], t[7], addresses, arena,
        )  # fmt: skip


def _load() -> ctypes.CDLL | None:
    for path in sorted(_HERE.glob("_rbv2*.so")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        lib.rbv2_scan.restype = ctypes.c_int
        lib.rbv2_scan.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
        lib.rbv2_fill.restype = ctypes.c_int
        lib.rbv2_fill.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
        return lib
    return None


_LIB = _load()
COMPILED = _LIB is not None
_MAX_OFFSET = 2**31 - 1  # Arrow binary/list offsets are int32


def decode(seg: Segments, *, compiled: bool | None = None) -> Columns:
    """Decode every segment; raises KernelError naming the first bad segment and record."""
    use_c = COMPILED if compiled is None else compiled and COMPILED
    nseg = len(seg)
    table = np.ascontiguousarray(seg.table, dtype=np.int64)
    totals = np.zeros(11, np.int64)  # the 9 totals, then where an error was found
    if use_c:
        assert _LIB is not None
        rc = _LIB.rbv2_scan(nseg, table.ctypes.data, totals.ctypes.data)
        if rc:
            raise KernelError(rc, int(totals[9]), int(totals[10]))
    else:
        _py_scan(table, totals)
    t = totals[:9].tolist()
    if max(t[0], t[1], t[3], t[4], t[2]) > _MAX_OFFSET:
        raise KernelError(-2, 0, 0)  # the caller fetches smaller answers; never reached at 2 GiB limits
    cols = Columns.allocate(t)
    if use_c:
        assert _LIB is not None
        _LIB.rbv2_fill(nseg, table.ctypes.data, cols.addresses.ctypes.data)
    else:
        _py_fill(table, cols)
    return cols


# -- the pure fallback (same passes, same errors) --------------------------------------------------


def _view(table: npt.NDArray[np.int64], s: int) -> memoryview:
    n = int(table[s, S_LEN])
    return memoryview((ctypes.c_ubyte * n).from_address(int(table[s, S_PTR]))).cast("B")


def zigzag_varint(buf: memoryview, p: int, end: int, s: int, i: int) -> tuple[int, int]:
    """The zigzag varint at ``p`` (read no further than ``end``) and the position after it;
    KernelError naming segment ``s`` and record ``i`` when it is cut or longer than 64 bits."""
    v = shift = 0
    while p < end:
        b = buf[p]
        p += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return (v >> 1) ^ -(v & 1), p
        shift += 7
        if shift > 63:
            raise KernelError(-2, s, i)
    raise KernelError(-1, s, i)


def _py_scan(table: npt.NDArray[np.int64], totals: npt.NDArray[np.int64]) -> None:
    t = [0] * 9
    for s in range(len(table)):
        buf = _view(table, s)
        last_delta = int(table[s, S_LAST_DELTA])
        p, end, prev, i = 0, len(buf), -1, 0

        def need(n: int, rend: int, p: int) -> None:
            if n < 0 or n > rend - p:
                raise KernelError(-2, s, i)  # noqa: B023 (used at once)

        for i in range(int(table[s, S_COUNT])):
            ln, p = zigzag_varint(buf, p, end, s, i)
            need(ln, end, p)
            if ln < 1:
                raise KernelError(-2, s, i)
            rend = p + ln
            p += 1
            _, p = zigzag_varint(buf, p, rend, s, i)
            od, p = zigzag_varint(buf, p, rend, s, i)
            if od <= prev or od > last_delta:
                raise KernelError(-3, s, i)
            prev = od
            for k, nulls in ((0, 5), (1, 6)):
                ln, p = zigzag_varint(buf, p, rend, s, i)
                if ln < -1:
                    raise KernelError(-2, s, i)
                if ln >= 0:
                    need(ln, rend, p)
                    p += ln
                    t[k] += ln
                else:
                    t[nulls] += 1
            hc, p = zigzag_varint(buf, p, rend, s, i)
            need(hc, rend, p)
            for _ in range(hc):
                ln, p = zigzag_varint(buf, p, rend, s, i)
                need(ln, rend, p)
                p += ln
                t[3] += ln
                ln, p = zigzag_varint(buf, p, rend, s, i)
                if ln < -1:
                    raise KernelError(-2, s, i)
                if ln >= 0:
                    need(ln, rend, p)
                    p += ln
                    t[4] += ln
                else:
                    t[7] += 1
            t[2] += hc
            if p != rend:
                raise KernelError(-4, s, i)
        if p != end:
            raise KernelError(-4, s, int(table[s, S_COUNT]))  # past the last record, as _rbv2.c says
        t[8] += int(table[s, S_COUNT])
    totals[:9] = t


def _wrap64(v: int) -> int:
    """``v`` as int64 arithmetic leaves it (Java's long, the C kernel): a timestamp delta may be any
    int64, and a Python int past the range would not fit the column."""
    return (v + 2**63) % 2**64 - 2**63


def _py_fill(table: npt.NDArray[np.int64], c: Columns) -> None:
    r = h = ko = vo = hko = hvo = 0
    c.k_off[0] = c.v_off[0] = c.h_off[0] = c.hk_off[0] = c.hv_off[0] = 0
    for s in range(len(table)):
        buf = _view(table, s)
        p, end = 0, len(buf)
        fixed = int(table[s, S_FIXED_TS])
        base_offset, base_ts = int(table[s, S_BASE_OFFSET]), int(table[s, S_BASE_TS])
        for _ in range(int(table[s, S_COUNT])):
            ln, p = zigzag_varint(buf, p, end, s, 0)
            rend = p + ln
            p += 1
            tsd, p = zigzag_varint(buf, p, end, s, 0)
            od, p = zigzag_varint(buf, p, end, s, 0)
            c.offset[r] = base_offset + od
            c.ts[r] = fixed if fixed != NO_TS else _wrap64(base_ts + tsd)
            ln, p = zigzag_varint(buf, p, end, s, 0)
            c.k_valid[r] = ln >= 0
            if ln >= 0:
                c.k_data[ko : ko + ln] = buf[p : p + ln]
                p += ln
                ko += ln
            c.k_off[r + 1] = ko
            ln, p = zigzag_varint(buf, p, end, s, 0)
            c.v_valid[r] = ln >= 0
            if ln >= 0:
                c.v_data[vo : vo + ln] = buf[p : p + ln]
                p += ln
                vo += ln
            c.v_off[r + 1] = vo
            hc, p = zigzag_varint(buf, p, end, s, 0)
            for _ in range(hc):
                ln, p = zigzag_varint(buf, p, end, s, 0)
                c.hk_data[hko : hko + ln] = buf[p : p + ln]
                p += ln
                hko += ln
                c.hk_off[h + 1] = hko
                ln, p = zigzag_varint(buf, p, end, s, 0)
                c.hv_valid[h] = ln >= 0
                if ln >= 0:
                    c.hv_data[hvo : hvo + ln] = buf[p : p + ln]
                    p += ln
                    hvo += ln
                c.hv_off[h + 1] = hvo
                h += 1
            c.h_off[r + 1] = h
            p = rend
            r += 1
