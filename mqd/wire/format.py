"""The record batch: one format on disk, on the wire and into Arrow.

A batch is a fixed 48-byte header followed by column sections laid out the way Arrow lays out
its own arrays (int64 timestamps, int32 offsets + data buffers for binary columns), each section
padded to 8 bytes. A consumer turns a batch into Arrow arrays by slicing buffers: no Python object
per record (DESIGN.md §4). The broker assigns offsets by rewriting ``base_offset`` in place; the CRC
starts after that field so the rewrite does not invalidate it. docs/protocol.md has the table.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mqd.errors import MqdError
from mqd.record_size import RecordTooLarge, first_too_large
from mqd.records import HEADERS_TYPE, RECORD_SCHEMA, fixed_width_array  # neutral ground

try:  # ISA-L's CRC-32 is bit-identical to zlib's and ~7x faster (bench/profile/REPORT.md)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal ships wheels for every platform we target
    from zlib import crc32 as _crc32

MAGIC = b"MQB1"
# magic, length, base_offset, crc, count, first_ts, max_ts, flags, reserved, header_count
HEADER = struct.Struct("<4sIqIIqqHHI")
HEADER_SIZE = HEADER.size  # 48
assert HEADER_SIZE == 48
CRC_FROM = 20  # the CRC covers bytes [20, length): everything after base_offset and crc
FLAG_KEY_NULLS = 1  # a key validity bitmap follows the data sections


class BatchError(MqdError, ValueError):
    """A batch is malformed: bad magic, length, CRC or internal offsets. Never retriable."""

    retriable = False


def _pad(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Header fields of one batch found at ``position`` in a buffer."""

    position: int
    length: int
    base_offset: int
    count: int
    first_timestamp: int
    max_timestamp: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------
# encoding (producers; not the consumer hot path)


def _binary_parts(values: Sequence[bytes | None] | pa.Array) -> tuple[np.ndarray, bytes, np.ndarray | None]:
    """Offsets (int32, n+1), data and an optional validity mask for a binary column."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if arr.type != pa.binary():
            arr = arr.cast(pa.binary())
        if arr.offset != 0:
            arr = pa.concat_arrays([arr])  # re-base a sliced array
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(arr) + 1)
        start = int(offsets[0])
        end = int(offsets[-1])
        data = bufs[2].slice(start, end - start).to_pybytes() if bufs[2] is not None else b""
        valid = None
        if arr.null_count:
            valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
        return (offsets - start).astype(np.int32), data, valid
    n = len(values)
    lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > 2**31 - 1:
        raise BatchError("batch data exceeds 2 GiB")
    valid = None
    if any(v is None for v in values):
        valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    data = b"".join(v for v in values if v is not None)
    return offsets.astype(np.int32), data, valid


def encode_batch(
    values: Sequence[bytes] | pa.Array,
    keys: Sequence[bytes | None] | pa.Array | None = None,
    timestamps: Sequence[int] | np.ndarray | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
    base_offset: int = 0,
) -> bytes:
    """Build one batch. ``timestamps`` are epoch milliseconds (default: now)."""
    n = len(values)
    if n == 0:
        raise BatchError("a batch needs at least one record")
    if keys is not None and len(keys) != n:
        raise BatchError("keys and values differ in length")
    if timestamps is None:
        ts = np.full(n, now_ms(), dtype=np.int64)
    else:
        ts = np.asarray(timestamps, dtype=np.int64)
        if ts.shape != (n,):
            raise BatchError("timestamps and values differ in length")
    v_off, v_data, _ = _binary_parts(values)
    k_valid: np.ndarray | None
    if keys is None:  # no keys at all: every key null
        k_off, k_data, k_valid = np.zeros(n + 1, dtype=np.int32), b"", np.zeros(n, dtype=bool)
    else:
        k_off, k_data, k_valid = _binary_parts(keys)
    if headers is not None:
        if len(headers) != n:
            raise BatchError("headers and values differ in length")
        counts = np.fromiter((len(h) for h in headers), dtype=np.int32, count=n)
        h_list = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=h_list[1:])
        flat = [kv for h in headers for kv in h]
        hk_off, hk_data, _ = _binary_parts([k.encode() for k, _ in flat])
        hv_off, hv_data, _ = _binary_parts([v for _, v in flat])
    else:
        h_list = np.zeros(n + 1, dtype=np.int32)
        hk_off = hv_off = np.zeros(1, dtype=np.int32)
        hk_data = hv_data = b""
    flags = 0
    sections: list[bytes] = [
        ts.tobytes(),
        k_off.tobytes(),
        v_off.tobytes(),
        h_list.tobytes(),
        hk_off.tobytes(),
        hv_off.tobytes(),
        k_data,
        v_data,
        hk_data,
        hv_data,
    ]
    if k_valid is not None:
        flags |= FLAG_KEY_NULLS
        sections.append(np.packbits(k_valid, bitorder="little").tobytes())
    body = b"".join(s + b"\0" * (_pad(len(s)) - len(s)) for s in sections)
    length = HEADER_SIZE + len(body)
    h_count = int(h_list[-1])
    tail = struct.pack("<IqqHHI", n, int(ts[0]), int(ts.max()), flags, 0, h_count) + body
    crc = _crc32(tail)
    return struct.pack("<4sIqI", MAGIC, length, base_offset, crc) + tail


def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    """Assign offsets to a batch in place (the broker does this on append)."""
    struct.pack_into("<q", buf, position + 8, base_offset)


# ---------------------------------------------------------------------------------------------
# scanning and validation (broker append, recovery; consumer)


def read_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchInfo:
    if len(buf) - position < HEADER_SIZE:
        raise BatchError(f"truncated header at {position}")
    magic, length, base, _crc, count, first_ts, max_ts, _flags, _res, _hc = HEADER.unpack_from(buf, position)
    if magic != MAGIC:
        raise BatchError(f"bad magic {magic!r} at {position}")
    if length < HEADER_SIZE or length % 8 or count == 0:
        raise BatchError(f"bad batch length {length} / count {count} at {position}")
    if position + length > len(buf):
        raise BatchError(f"truncated batch at {position}: {length} bytes announced")
    return BatchInfo(position, length, base, count, first_ts, max_ts)


def check_crc(buf: bytes | bytearray | memoryview, info: BatchInfo) -> None:
    mv = memoryview(buf)
    stored = struct.unpack_from("<I", mv, info.position + 16)[0]
    if _crc32(mv[info.position + CRC_FROM : info.position + info.length]) != stored:
        raise BatchError(f"CRC mismatch in batch at {info.position} (base offset {info.base_offset})")


def scan(buf: bytes | bytearray | memoryview, *, crc: bool = True) -> list[BatchInfo]:
    """All whole batches in ``buf``; raises BatchError at the first bad one."""
    out: list[BatchInfo] = []
    pos, end = 0, len(buf)
    while pos < end:
        info = read_header(buf, pos)
        if crc:
            check_crc(buf, info)
        out.append(info)
        pos += info.length
    return out


def scan_valid_prefix(buf: bytes | bytearray | memoryview) -> tuple[list[BatchInfo], int]:
    """Batches up to the first torn or corrupt one, and the byte length of that valid prefix."""
    out: list[BatchInfo] = []
    pos, end = 0, len(buf)
    while pos < end:
        try:
            info = read_header(buf, pos)
            check_crc(buf, info)
            _layout(buf, info)
        except BatchError:
            break
        out.append(info)
        pos += info.length
    return out, pos


@dataclass(frozen=True, slots=True)
class _Layout:
    ts: int
    k_off: int
    v_off: int
    h_list: int
    hk_off: int
    hv_off: int
    k_data: int
    v_data: int
    hk_data: int
    hv_data: int
    k_valid: int  # -1 when absent
    k_len: int
    v_len: int
    hk_len: int
    hv_len: int
    h_count: int


_INT32 = struct.Struct("<i")


def _offsets_end(
    buf: bytes | bytearray | memoryview, at: int, count: int, deep: bool, info: BatchInfo
) -> int:
    """The last of the ``count + 1`` int32 offsets at ``at``, checked to start at 0 and not go
    down; ``deep=False`` checks only both ends (two reads, no array: it runs per batch)."""
    first = _INT32.unpack_from(buf, at)[0]
    last = _INT32.unpack_from(buf, at + 4 * count)[0]
    if first != 0 or last < 0:
        raise BatchError(f"batch at {info.position}: offsets not monotonic from 0")
    if deep and count:
        arr = np.frombuffer(buf, dtype="<i4", count=count + 1, offset=at)
        if np.any(arr[1:] < arr[:-1]):
            raise BatchError(f"batch at {info.position}: offsets not monotonic from 0")
    return int(last)


def _layout(buf: bytes | bytearray | memoryview, info: BatchInfo, deep: bool = True) -> _Layout:
    """Section positions of a batch, checking every offsets array is consistent with its length.

    ``deep=False`` skips the monotonicity scans (O(records)) and keeps the O(1) bound checks: for
    bytes whose CRC matched what a broker validated deeply on produce.
    """
    n = info.count
    flags, _res, h_count = struct.unpack_from("<HHI", buf, info.position + 40)
    p = info.position + HEADER_SIZE
    end = info.position + info.length
    ts = p
    p += _pad(8 * n)
    k_off = p
    p += _pad(4 * (n + 1))
    v_off = p
    p += _pad(4 * (n + 1))
    h_list = p
    p += _pad(4 * (n + 1))
    hk_off = p
    p += _pad(4 * (h_count + 1))
    hv_off = p
    p += _pad(4 * (h_count + 1))
    if p > end:
        raise BatchError(f"batch at {info.position}: sections exceed its length")

    k_len = _offsets_end(buf, k_off, n, deep, info)
    v_len = _offsets_end(buf, v_off, n, deep, info)
    if _offsets_end(buf, h_list, n, deep, info) != h_count:
        raise BatchError(f"batch at {info.position}: header count mismatch")
    hk_len = _offsets_end(buf, hk_off, h_count, deep, info)
    hv_len = _offsets_end(buf, hv_off, h_count, deep, info)
    k_data = p
    p += _pad(k_len)
    v_data = p
    p += _pad(v_len)
    hk_data = p
    p += _pad(hk_len)
    hv_data = p
    p += _pad(hv_len)
    k_valid = -1
    if flags & FLAG_KEY_NULLS:
        k_valid = p
        p += _pad((n + 7) // 8)
    if p != end:
        raise BatchError(f"batch at {info.position}: {end - p} bytes unaccounted for")
    return _Layout(
        ts,
        k_off,
        v_off,
        h_list,
        hk_off,
        hv_off,
        k_data,
        v_data,
        hk_data,
        hv_data,
        k_valid,
        k_len,
        v_len,
        hk_len,
        hv_len,
        h_count,
    )


def validate(buf: bytes | bytearray | memoryview) -> list[BatchInfo]:
    """Full check of produced bytes before they touch a log: header, CRC and section layout."""
    infos = scan(buf, crc=True)
    if not infos:
        raise BatchError("empty produce body")
    for info in infos:
        _layout(buf, info)
    return infos


# ---------------------------------------------------------------------------------------------
# decoding into Arrow (consumer hot path: per batch work only)


_INT64 = pa.int64()
_TIMESTAMP = pa.timestamp("ms", tz="UTC")
_BINARY = pa.binary()
_STRING = pa.string()
_HEADER_FIELDS = list(HEADERS_TYPE.value_type)
_NO_HEADER_ENTRIES = pa.StructArray.from_arrays(
    [pa.array([], type=_STRING), pa.array([], type=_BINARY)], fields=_HEADER_FIELDS
)


def to_arrow(
    buf: pa.Buffer | bytes | memoryview,
    info: BatchInfo,
    start_offset: int | None = None,
    *,
    deep_check: bool = True,
) -> pa.RecordBatch:
    """Arrow view of one batch, zero-copy over ``buf``; records before ``start_offset`` are cut.

    ``deep_check=False`` is for a batch whose CRC was just checked (see ``_layout``).
    """
    pbuf = buf if isinstance(buf, pa.Buffer) else pa.py_buffer(buf)
    lay = _layout(memoryview(pbuf), info, deep=deep_check)
    n = info.count
    sl = pbuf.slice
    ts = pa.Array.from_buffers(_TIMESTAMP, n, [None, sl(lay.ts, 8 * n)])
    kvalid = sl(lay.k_valid, (n + 7) // 8) if lay.k_valid >= 0 else None
    key = pa.Array.from_buffers(_BINARY, n, [kvalid, sl(lay.k_off, 4 * (n + 1)), sl(lay.k_data, lay.k_len)])
    value = pa.Array.from_buffers(_BINARY, n, [None, sl(lay.v_off, 4 * (n + 1)), sl(lay.v_data, lay.v_len)])
    hc = lay.h_count
    if hc:
        hkeys = pa.Array.from_buffers(
            _STRING, hc, [None, sl(lay.hk_off, 4 * (hc + 1)), sl(lay.hk_data, lay.hk_len)]
        )
        hvals = pa.Array.from_buffers(
            _BINARY, hc, [None, sl(lay.hv_off, 4 * (hc + 1)), sl(lay.hv_data, lay.hv_len)]
        )
        entries = pa.StructArray.from_arrays([hkeys, hvals], fields=_HEADER_FIELDS)
    else:
        entries = _NO_HEADER_ENTRIES  # most batches: every record's list is empty
    headers = pa.Array.from_buffers(HEADERS_TYPE, n, [None, sl(lay.h_list, 4 * (n + 1))], children=[entries])
    offsets = fixed_width_array(np.arange(info.base_offset, info.base_offset + n, dtype=np.int64), _INT64)
    batch = pa.RecordBatch.from_arrays([offsets, ts, key, value, headers], schema=RECORD_SCHEMA)
    if start_offset is not None and start_offset > info.base_offset:
        batch = batch.slice(start_offset - info.base_offset)
    return batch


def check_record_sizes(buf: bytes | memoryview, infos: list[BatchInfo], limit: int) -> None:
    """Raise RecordTooLarge for the first record above ``limit`` in the validated batches
    ``infos`` of ``buf`` (a produce request), naming it by its position in the request."""
    before = 0  # records in the batches before this one
    for info in infos:
        if info.length > limit:  # else its records are smaller than the batch: nothing to look at
            # the caller validated the batches (CRC and layout): no second deep check
            found = first_too_large(to_arrow(buf, info, deep_check=False), limit)
            if found is not None:
                raise RecordTooLarge(f"record {before + found[0]} of the request (from 0)", found[1], limit)
        before += info.count
