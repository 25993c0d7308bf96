"""Decoding one partition's records of a Kafka Fetch answer (RecordBatch v2) into the engine's Arrow
batches (mqd.consumer.source.Decoded; columns as mqd.wire.format.RECORD_SCHEMA).

Per batch, in Python: the 61-byte header, the CRC-32C (crc32c package, hardware), decompression
(cramjam: gzip, snappy raw or xerial-framed, lz4 frame, zstd), control batches and, under
read_committed, the batches of aborted transactions (the answer's aborted-transaction list, Kafka's
own algorithm). Per record: the records kernel (records_kernel), one call for all batches of the
answer. A partial trailing batch (the broker cuts at max_bytes) ends the walk without an error; magic
0/1, a bad CRC, a bad length or malformed records stop it with an error naming the topic-partition,
returning the good batches before it: whatever the bytes, decode_partition returns, it never raises
(the engine parks a partition whose answers keep failing; an exception would skip that).

Offsets only go up: a batch that overlaps or lies behind what the same answer already gave (a buggy
or hostile broker; Kafka's own never sends one) is cut to its records past the highest offset so far,
counted (mqd_kafka_out_of_order_records_total) and logged with the broker named, so no offset lands
twice.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cramjam
import crc32c
import numpy as np
import pyarrow as pa
import structlog
from prometheus_client.metrics import Counter

from mqd import metrics
from mqd.consumer.source import Decoded, DecodedBatch
from mqd.records import HEADERS_TYPE, RECORD_SCHEMA
from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.records_kernel import NO_TS, KernelError, Segments, zigzag_varint
from mqd.topic_partition import TopicPartition

log = structlog.get_logger("mqd.sources.kafka.record_batch")

# baseOffset batchLength partitionLeaderEpoch magic crc attributes lastOffsetDelta baseTimestamp
# maxTimestamp producerId producerEpoch baseSequence recordsCount
HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength precede what batchLength counts
CRC_FROM = 21  # the CRC covers attributes to the end of the batch
COMPRESSION_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
_XERIAL = b"\x82SNAPPY\x00"
_MAX_OFFSET = 2**63 - 1  # offsets are int64 everywhere after the decoder (Arrow, the landing)

aborted_records = Counter(
    "mqd_kafka_aborted_records_total",
    "Records of aborted transactions skipped under isolation_level=read_committed",
    ["topic", "partition"],
    registry=metrics.REGISTRY,
)
control_records = Counter(
    "mqd_kafka_control_records_total",
    "Transaction markers (control batches) skipped: offsets, not data",
    ["topic", "partition"],
    registry=metrics.REGISTRY,
)
out_of_order_records = Counter(
    "mqd_kafka_out_of_order_records_total",
    "Records dropped because their batch overlapped or went behind offsets the same Fetch answer "
    "already held (a buggy or hostile broker): each offset is delivered once",
    ["topic", "partition"],
    registry=metrics.REGISTRY,
)


class RecordBatchError(ValueError):
    """A batch that cannot be decoded (never retried as is: the partition is parked)."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int


def _snappy(data: bytes | memoryview) -> bytes | cramjam.Buffer:
    # the Java client frames snappy the xerial way (magic, version, compat, then length-prefixed
    # raw blocks); librdkafka writes one raw block
    if bytes(data[:8]) != _XERIAL:
        return cramjam.snappy.decompress_raw(data)
    out = bytearray()
    pos, end = 16, len(data)
    while pos + 4 <= end:
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise RecordBatchError("truncated xerial snappy block")
        out += cramjam.snappy.decompress_raw(data[pos : pos + n])
        pos += n
    return bytes(out)


def decompress(codec: int, data: memoryview) -> bytes | cramjam.Buffer | memoryview:
    if codec == 0:
        return data
    try:
        if codec == 1:
            return cramjam.gzip.decompress(data)
        if codec == 2:
            return _snappy(data)
        if codec == 3:
            return cramjam.lz4.decompress(data)
        if codec == 4:
            return cramjam.zstd.decompress(data)
    except cramjam.DecompressionError as exc:
        raise RecordBatchError(f"cannot decompress ({_CODECS.get(codec)}): {exc}") from exc
    raise RecordBatchError(f"unknown compression codec {codec}")


_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _control_type(records: bytes | cramjam.Buffer | memoryview) -> int:
    """The type of a control batch's first record (0 abort, 1 commit): key = version int16, type int16."""
    buf = memoryview(records).cast("B")
    end = len(buf)
    try:
        _, pos = zigzag_varint(buf, 0, end, 0, 0)  # length
        pos += 1  # attributes
        _, pos = zigzag_varint(buf, pos, end, 0, 0)  # timestampDelta
        _, pos = zigzag_varint(buf, pos, end, 0, 0)  # offsetDelta
        key_len, pos = zigzag_varint(buf, pos, end, 0, 0)
    except KernelError as exc:
        raise RecordBatchError(f"control {exc}") from None
    if key_len < 4 or pos + 4 > end:
        raise RecordBatchError("control record key too short")
    return int(struct.unpack_from(">h", buf, pos + 2)[0])


_Row = tuple[int, int, int, int, int, int, int]  # a row of records_kernel's segment table


@dataclass(slots=True)
class _Scan:
    """What one pass over an answer's batch headers found: the kernel's segment table (``rows``)
    and where the answer stops, with the decompressed sections kept alive until the kernel copied
    them."""

    next_offset: int | None = None  # the offset after the last whole batch delivered
    wire: int = 0  # bytes of the batches delivered
    error: str | None = None
    keep: list[object] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)
    seg_start_next: list[int | None] = field(default_factory=list)  # next_offset before each segment
    floors: list[int] = field(default_factory=list)  # per segment: its records below this are not new
    # batches behind what this answer already gave: (segment it precedes or is, base offset,
    # records dropped; -1 for a segment whose cut the decoded offsets tell)
    disorder: list[tuple[int, int, int]] = field(default_factory=list)
    dropped: int = 0  # records of aborted transactions
    controls: int = 0  # control batches


def decode_partition(
    data: bytes | memoryview,
    start: int,
    check_crc: bool,
    *,
    tp: TopicPartition,
    aborted: Sequence[AbortedTxn] | None = None,
    compiled: bool | None = None,
    broker: str | None = None,
) -> Decoded:
    """Records from ``start`` on, offsets strictly increasing, as DecodedBatches from ``start`` to
    the end of the last whole batch (one, or one per run of kept records where the answer overlapped
    itself). ``aborted``: the answer's aborted transactions under read_committed, None under
    read_uncommitted. ``broker`` names the node in the log line of an out-of-order answer."""
    scan = _scan(memoryview(data).cast("B"), start, check_crc, tp, aborted)
    _count_skipped(tp, scan)
    records, held = _kernel_records(scan, tp, compiled)
    scan.keep.clear()
    next_offset = scan.next_offset
    if next_offset is None or next_offset <= start:
        return Decoded([], scan.error)
    nseg = len(scan.rows)
    # what an error cut off was not delivered: neither are its out-of-order batches
    disorder = [d for d in scan.disorder if d[0] < nseg or (d[0] == nseg and d[2] >= 0)]
    late = 0
    if records is None:
        pieces = [DecodedBatch(_empty(), start, next_offset, scan.wire)]
    else:
        overlapping = [s for s, _, k in disorder if k < 0]
        pieces, late = _cut(records, scan.rows, scan.floors, overlapping, start, next_offset, scan.wire)
    if disorder:
        _report(tp, broker, start, disorder, late)
    return Decoded(pieces, scan.error, held)


def _scan(
    mv: memoryview, start: int, check_crc: bool, tp: TopicPartition, aborted: Sequence[AbortedTxn] | None
) -> _Scan:
    """One pass over the batch headers (no record is touched): the segments the kernel decodes, the
    batches skipped (behind ``start``, aborted, control) and the first problem, which ends the pass."""
    out = _Scan()
    size = len(mv)
    pos = 0
    expected = start  # the lowest offset not delivered yet: start, then the highest batch end so far
    txns = sorted(aborted or (), key=lambda a: a.first_offset)
    ti = 0
    aborted_pids: set[int] = set()
    base_addr = np.frombuffer(mv, np.uint8).ctypes.data if size else 0
    while pos + 17 <= size:
        base, length = struct.unpack_from(">qi", mv, pos)
        magic = mv[pos + 16]
        if magic != 2:
            out.error = (
                f"{tp}: record batch at offset {base} has magic {magic}: only magic 2 (Kafka 0.11+ "
                "RecordBatch) is supported; upgrade the topic's message format"
            )
            break
        total = LOG_OVERHEAD + length
        if length < HEADER_SIZE - LOG_OVERHEAD:
            out.error = f"{tp}: record batch at offset {base} has a bad length {length}"
            break
        if pos + total > size:
            break  # partial trailing batch: the broker cut the answer at max_bytes
        (_, _, _, _, crc, attrs, last_delta, base_ts, max_ts, pid, _, _, count) = HEADER.unpack_from(mv, pos)
        if check_crc and crc32c.crc32c(mv[pos + CRC_FROM : pos + total]) != crc:
            out.error = f"{tp}: record batch at offset {base}: CRC-32C mismatch (corrupt data)"
            break
        batch_next = base + last_delta + 1
        if count < 0 or batch_next > _MAX_OFFSET:
            what = f"a negative record count {count}" if count < 0 else "offsets past 2^63-1"
            out.error = f"{tp}: record batch at offset {base} has {what}"
            break
        here = pos
        pos += total
        skip = False
        if aborted is not None and pid >= 0:
            while ti < len(txns) and txns[ti].first_offset <= base + last_delta:
                aborted_pids.add(txns[ti].producer_id)
                ti += 1
        if batch_next <= expected:
            if out.next_offset is not None:  # behind this answer's own batches, not only before start
                out.disorder.append((len(out.rows), base, 0 if attrs & CONTROL else count))
            continue
        overlaps = out.next_offset is not None and base < expected
        codec = attrs & COMPRESSION_MASK
        try:
            if attrs & CONTROL:
                skip = True
                out.controls += 1
                if aborted is not None and pid in aborted_pids and count > 0:
                    body = decompress(codec, mv[here + HEADER_SIZE : here + total])
                    if _control_type(body) == 0:
                        aborted_pids.discard(pid)
            elif aborted is not None and attrs & TRANSACTIONAL and pid in aborted_pids:
                skip = True
                out.dropped += count
            if not skip and count > 0:
                section = decompress(codec, mv[here + HEADER_SIZE : here + total])
                if codec == 0:
                    addr = base_addr + here + HEADER_SIZE
                    n = total - HEADER_SIZE
                else:
                    arr = np.frombuffer(memoryview(section), np.uint8)
                    out.keep.append(arr)
                    addr, n = (arr.ctypes.data if len(arr) else 0), len(arr)
                fixed = max_ts if attrs & TIMESTAMP_LOG_APPEND else NO_TS
                if overlaps:
                    out.disorder.append((len(out.rows), base, -1))
                out.rows.append((addr, n, count, last_delta, base, base_ts, fixed))
                out.seg_start_next.append(out.next_offset)
                out.floors.append(expected)
            elif overlaps:
                out.disorder.append((len(out.rows), base, 0))  # nothing of it delivered anyway
        except (RecordBatchError, IndexError, struct.error) as exc:
            out.error = f"{tp}: record batch at offset {base}: {exc}"
            break
        out.wire += total
        out.next_offset = batch_next
        expected = batch_next
    return out


def _count_skipped(tp: TopicPartition, scan: _Scan) -> None:
    if scan.dropped or scan.controls:
        label = (tp.topic, str(tp.partition))
        if scan.dropped:
            aborted_records.labels(*label).inc(scan.dropped)
        if scan.controls:
            control_records.labels(*label).inc(scan.controls)


def _kernel_records(
    scan: _Scan, tp: TopicPartition, compiled: bool | None
) -> tuple[pa.RecordBatch | None, tuple[tuple[object, int], ...]]:
    """The scanned segments' records as one Arrow batch (None: no segment). A segment the kernel
    refuses is cut with all after it and becomes the scan's error (so this ends; the last error is
    the earliest), the delivered end moving back to before it."""
    rows = scan.rows
    while rows:
        try:
            return _to_arrow(rows, compiled)
        except KernelError as exc:
            bad = min(max(exc.segment, 0), len(rows) - 1)
            scan.error = f"{tp}: record batch at offset {rows[bad][records_kernel.S_BASE_OFFSET]}: {exc}"
            scan.next_offset = scan.seg_start_next[bad]
            scan.wire = 0  # unknown split: charge nothing rather than wrongly; the budget pins the body
            del rows[bad:]
    return None, ()


def _cut(
    records: pa.RecordBatch,
    rows: list[_Row],
    floors: list[int],
    overlapping: list[int],
    start: int,
    next_offset: int,
    wire: int,
) -> tuple[list[DecodedBatch], int]:
    """``records`` without what lies below each segment's floor, as zero-copy slices: the first
    segment's records before ``start`` (the batch holding it begins earlier) and the overlapping
    segments' records the answer gave before; the number of the latter."""
    offsets = records.column(0).to_numpy()
    first_count = rows[0][records_kernel.S_COUNT]
    cut = int(np.searchsorted(offsets[:first_count], floors[0]))
    if not overlapping:
        return [DecodedBatch(records.slice(cut) if cut else records, start, next_offset, wire)], 0
    # each overlapping segment loses a prefix (its offsets increase, the kernel checked): the kept
    # rows are runs between those prefixes, each its own slice of the one allocation
    runs: list[tuple[int, int]] = []
    late = 0
    seg_rows = [0, *itertools.accumulate(r[records_kernel.S_COUNT] for r in rows)]
    lo = cut
    for s in overlapping:
        r0, r1 = seg_rows[s], seg_rows[s + 1]
        if s == 0:
            late += cut
            continue
        n = int(np.searchsorted(offsets[r0:r1], floors[s]))
        if n:
            runs.append((lo, r0))
            lo = r0 + n
            late += n
    runs.append((lo, len(records)))
    runs = [(a, b) for a, b in runs if b > a]
    if not runs:
        return [DecodedBatch(records.slice(0, 0), start, next_offset, wire)], late
    kept = sum(b - a for a, b in runs)
    pieces: list[DecodedBatch] = []
    charged = 0
    for i, (a, b) in enumerate(runs):
        last = i == len(runs) - 1
        first = start if i == 0 else int(offsets[a])
        upto = next_offset if last else int(offsets[runs[i + 1][0]])
        nbytes = wire - charged if last else wire * (b - a) // kept
        charged += nbytes
        pieces.append(DecodedBatch(records.slice(a, b - a), first, upto, nbytes))
    return pieces, late


def _report(
    tp: TopicPartition, broker: str | None, start: int, disorder: list[tuple[int, int, int]], late: int
) -> None:
    """Count and log an answer whose batches overlapped or went behind each other."""
    records = late + sum(k for _, _, k in disorder if k > 0)
    if records:
        out_of_order_records.labels(tp.topic, str(tp.partition)).inc(records)
    log.warning(
        "kafka fetch answer with overlapping or backward record batches: cut to increasing offsets",
        topic=tp.topic,
        partition=tp.partition,
        broker=broker or "unknown",
        fetch_offset=start,
        batches=len(disorder),
        first_batch_offset=disorder[0][1],
        records_dropped=records,
    )


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=RECORD_SCHEMA)


def _validity(valid: np.ndarray, nulls: int) -> pa.Buffer | None:
    return pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None


def _check_header_keys(hkeys: pa.Array, c: records_kernel.Columns, seg: Segments) -> None:
    """Header keys are Kafka strings; invalid UTF-8 in an Arrow string column would break the
    Parquet and Spark readers downstream, so it is a malformed batch (the slow search for which
    record runs only then)."""
    try:
        hkeys.validate(full=True)
    except pa.ArrowInvalid:
        data = c.hk_data.tobytes()
        for j in range(len(c.hk_off) - 1):
            try:
                data[c.hk_off[j] : c.hk_off[j + 1]].decode("utf-8")
            except UnicodeDecodeError:
                break
        r = int(np.searchsorted(c.h_off, j, side="right")) - 1
        starts = np.concatenate([[0], np.cumsum(seg.counts)])
        s = int(np.searchsorted(starts, r, side="right")) - 1
        raise KernelError(-6, s, r - int(starts[s])) from None


def _to_arrow(
    rows: list[_Row], compiled: bool | None
) -> tuple[pa.RecordBatch, tuple[tuple[object, int], ...]]:
    """The records as Arrow, and the allocation their buffers live in (Decoded.held)."""
    seg = Segments.of(rows)
    c = records_kernel.decode(seg, compiled=compiled)
    n, nh = len(c.offset), len(c.hv_valid)
    buf = pa.py_buffer
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, buf(c.offset)])
    ts = pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), n, [None, buf(c.ts)])
    key = pa.Array.from_buffers(
        pa.binary(), n, [_validity(c.k_valid, c.null_keys), buf(c.k_off), buf(c.k_data)], c.null_keys
    )
    value = pa.Array.from_buffers(
        pa.binary(), n, [_validity(c.v_valid, c.null_values), buf(c.v_off), buf(c.v_data)], c.null_values
    )
    hkeys = pa.Array.from_buffers(pa.string(), nh, [None, buf(c.hk_off), buf(c.hk_data)])
    if nh:
        _check_header_keys(hkeys, c, seg)
    hvals = pa.Array.from_buffers(
        pa.binary(),
        nh,
        [_validity(c.hv_valid, c.null_header_values), buf(c.hv_off), buf(c.hv_data)],
        c.null_header_values,
    )
    entries = pa.StructArray.from_arrays([hkeys, hvals], fields=list(HEADERS_TYPE.value_type))
    headers = pa.Array.from_buffers(HEADERS_TYPE, n, [None, buf(c.h_off)], children=[entries])
    batch = pa.RecordBatch.from_arrays([offsets, ts, key, value, headers], schema=RECORD_SCHEMA)
    return batch, ((c.arena, c.arena.nbytes),)


# baseOffset batchLength partitionLeaderEpoch magic crc attributes lastOffsetDelta
_HEAD_START = struct.Struct(">qiibIhi")


def batch_heads(data: bytes | memoryview) -> tuple[list[tuple[int, int]], int | None]:
    """One header read per complete v2 batch of ``data`` (a Fetch answer's records), no decoding:
    (base offset, partition leader epoch) where the epoch changes, first batch included (a batch
    without an epoch, -1 in old producers' logs, ends these), and the offset after the last complete
    batch, where the next fetch starts when every batch decodes (None without one). Anything not v2
    or with a bad length ends the walk (decoding stops there too). A batch that ends at or behind
    one before it moves neither (decode_partition drops it)."""
    epochs: list[tuple[int, int]] = []
    end: int | None = None
    with_epochs = True
    pos, size = 0, len(data)
    while pos + HEADER_SIZE <= size:
        base, length, epoch, magic, _, _, last_delta = _HEAD_START.unpack_from(data, pos)
        if magic != 2 or length < HEADER_SIZE - LOG_OVERHEAD or pos + LOG_OVERHEAD + length > size:
            break
        pos += LOG_OVERHEAD + length
        if end is not None and base + last_delta + 1 <= end:
            continue
        if epoch < 0:
            with_epochs = False
        elif with_epochs and (not epochs or epochs[-1][1] != epoch):
            # an overlapping batch delivers records from the previous end on, not from its base
            epochs.append((base if end is None else max(base, end), epoch))
        end = base + last_delta + 1
    return epochs, end
