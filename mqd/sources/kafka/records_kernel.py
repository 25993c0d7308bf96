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


@dataclass(slots=True)
class Segments:
    """The records sections to decode: one entry per batch (arrays of equal length)."""

    ptrs: npt.NDArray[np.uint64]  # address of each records section (kept alive by the caller)
    lens: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int32]
    last_delta: npt.NDArray[np.int32]
    base_offset: npt.NDArray[np.int64]
    base_ts: npt.NDArray[np.int64]
    fixed_ts: npt.NDArray[np.int64]  # LogAppendTime batches: the batch's maxTimestamp; else NO_TS


@dataclass(slots=True)
class Columns:
    """Output buffers; validity arrays are one byte per entry (1 = present)."""

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

    @classmethod
    def allocate(cls, t: list[int]) -> Columns:
        n, h = t[8], t[2]
        e = np.empty
        return cls(
            e(n, np.int64), e(n, np.int64),
            e(n + 1, np.int32), e(t[0], np.uint8), e(n, np.uint8),
            e(n + 1, np.int32), e(t[1], np.uint8), e(n, np.uint8),
            e(n + 1, np.int32),
            e(h + 1, np.int32), e(t[3], np.uint8),
            e(h + 1, np.int32), e(t[4], np.uint8), e(h, np.uint8),
            t[5], t[6], t[7],
        )  # fmt: skip


def _load() -> ctypes.CDLL | None:
    for path in sorted(_HERE.glob("_rbv2*.so")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        lib.rbv2_scan.restype = ctypes.c_int
        lib.rbv2_fill.restype = ctypes.c_int
        return lib
    return None


_LIB = _load()
COMPILED = _LIB is not None
_MAX_OFFSET = 2**31 - 1  # Arrow binary/list offsets are int32


def _p(a: npt.NDArray[np.generic]) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def decode(seg: Segments, *, compiled: bool | None = None) -> Columns:
    """Decode every segment; raises KernelError naming the first bad segment and record."""
    use_c = COMPILED if compiled is None else compiled and COMPILED
    nseg = len(seg.ptrs)
    totals = np.zeros(9, np.int64)
    where = np.zeros(2, np.int64)
    if use_c:
        assert _LIB is not None
        rc = _LIB.rbv2_scan(
            ctypes.c_int32(nseg), _p(seg.ptrs), _p(seg.lens), _p(seg.counts), _p(seg.last_delta),
            _p(totals), _p(where),
        )  # fmt: skip
        if rc:
            raise KernelError(rc, int(where[0]), int(where[1]))
    else:
        _py_scan(seg, totals)
    t = [int(x) for x in totals]
    if max(t[0], t[1], t[3], t[4], t[2]) > _MAX_OFFSET:
        raise KernelError(-2, 0, 0)  # the caller fetches smaller answers; never reached at 2 GiB limits
    cols = Columns.allocate(t)
    if use_c:
        assert _LIB is not None
        _LIB.rbv2_fill(
            ctypes.c_int32(nseg), _p(seg.ptrs), _p(seg.counts), _p(seg.base_offset), _p(seg.base_ts),
            _p(seg.fixed_ts), _p(cols.offset), _p(cols.ts), _p(cols.k_off), _p(cols.k_data),
            _p(cols.k_valid), _p(cols.v_off), _p(cols.v_data), _p(cols.v_valid), _p(cols.h_off),
            _p(cols.hk_off), _p(cols.hk_data), _p(cols.hv_off), _p(cols.hv_data), _p(cols.hv_valid),
        )  # fmt: skip
    else:
        _py_fill(seg, cols)
    return cols


# -- the pure fallback (same passes, same errors) --------------------------------------------------


def _view(seg: Segments, s: int) -> memoryview:
    n = int(seg.lens[s])
    return memoryview((ctypes.c_ubyte * n).from_address(int(seg.ptrs[s]))).cast("B")


def _varint(buf: memoryview, p: int, end: int, s: int, i: int) -> tuple[int, int]:
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


def _py_scan(seg: Segments, totals: npt.NDArray[np.int64]) -> None:
    t = [0] * 9
    for s in range(len(seg.ptrs)):
        buf = _view(seg, s)
        p, end, prev, i = 0, len(buf), -1, 0

        def need(n: int, rend: int, p: int) -> None:
            if n < 0 or n > rend - p:
                raise KernelError(-2, s, i)  # noqa: B023 (used at once)

        for i in range(int(seg.counts[s])):
            ln, p = _varint(buf, p, end, s, i)
            need(ln, end, p)
            if ln < 1:
                raise KernelError(-2, s, i)
            rend = p + ln
            p += 1
            _, p = _varint(buf, p, rend, s, i)
            od, p = _varint(buf, p, rend, s, i)
            if od <= prev or od > int(seg.last_delta[s]):
                raise KernelError(-3, s, i)
            prev = od
            for k, nulls in ((0, 5), (1, 6)):
                ln, p = _varint(buf, p, rend, s, i)
                if ln < -1:
                    raise KernelError(-2, s, i)
                if ln >= 0:
                    need(ln, rend, p)
                    p += ln
                    t[k] += ln
                else:
                    t[nulls] += 1
            hc, p = _varint(buf, p, rend, s, i)
            need(hc, rend, p)
            for _ in range(hc):
                ln, p = _varint(buf, p, rend, s, i)
                need(ln, rend, p)
                p += ln
                t[3] += ln
                ln, p = _varint(buf, p, rend, s, i)
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
            raise KernelError(-4, s, i)
        t[8] += int(seg.counts[s])
    totals[:] = t


def _py_fill(seg: Segments, c: Columns) -> None:
    r = h = ko = vo = hko = hvo = 0
    c.k_off[0] = c.v_off[0] = c.h_off[0] = c.hk_off[0] = c.hv_off[0] = 0
    for s in range(len(seg.ptrs)):
        buf = _view(seg, s)
        p, end = 0, len(buf)
        fixed = int(seg.fixed_ts[s])
        for _ in range(int(seg.counts[s])):
            ln, p = _varint(buf, p, end, s, 0)
            rend = p + ln
            p += 1
            tsd, p = _varint(buf, p, end, s, 0)
            od, p = _varint(buf, p, end, s, 0)
            c.offset[r] = int(seg.base_offset[s]) + od
            c.ts[r] = fixed if fixed != NO_TS else int(seg.base_ts[s]) + tsd
            ln, p = _varint(buf, p, end, s, 0)
            c.k_valid[r] = ln >= 0
            if ln >= 0:
                c.k_data[ko : ko + ln] = buf[p : p + ln]
                p += ln
                ko += ln
            c.k_off[r + 1] = ko
            ln, p = _varint(buf, p, end, s, 0)
            c.v_valid[r] = ln >= 0
            if ln >= 0:
                c.v_data[vo : vo + ln] = buf[p : p + ln]
                p += ln
                vo += ln
            c.v_off[r + 1] = vo
            hc, p = _varint(buf, p, end, s, 0)
            for _ in range(hc):
                ln, p = _varint(buf, p, end, s, 0)
                c.hk_data[hko : hko + ln] = buf[p : p + ln]
                p += ln
                hko += ln
                c.hk_off[h + 1] = hko
                ln, p = _varint(buf, p, end, s, 0)
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
