"""The Kafka RecordBatch v2 decoder against aiokafka's own batch builder and reader as the oracle:
every codec, null keys/values, headers, cuts at the requested offset, CRC, truncation, magic 0/1,
control batches and aborted transactions, with the compiled kernel and the pure fallback."""

from __future__ import annotations

import gc
import struct
import weakref
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.fake_kafka import Rec, build, control, recrc

from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.record_batch import AbortedTxn, decode_partition
from mqd.topic_partition import TopicPartition

TP = TopicPartition("orders", 3)
KERNELS = [False, *([True] if records_kernel.COMPILED else [])]


def oracle(data: bytes) -> list[dict[str, Any]]:
    out = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        batch = DefaultRecordBatch(data[pos : pos + 12 + length])
        for r in batch:
            out.append(
                {
                    "offset": r.offset,
                    "ts": r.timestamp,
                    "key": r.key,
                    "value": r.value,
                    "headers": [{"key": k, "value": v} for k, v in r.headers],
                }
            )
        pos += 12 + length
    return out


def rows(data: bytes, start: int, compiled: bool, **kw: Any) -> list[dict[str, Any]]:
    d = decode_partition(data, start, True, tp=TP, compiled=compiled, **kw)
    assert d.error is None
    out = []
    for b in d.batches:
        for r in b.records.to_pylist():
            out.append(
                {
                    "offset": r["offset"],
                    "ts": int(r["timestamp"].timestamp() * 1000),
                    "key": r["key"],
                    "value": r["value"],
                    "headers": r["headers"],
                }
            )
    return out


header = st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=8)))
record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.lists(header, max_size=3),
)


@pytest.mark.parametrize("compiled", KERNELS)
@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.tuples(st.lists(record, min_size=1, max_size=12), st.integers(0, 4)), max_size=5),
    start_frac=st.floats(0, 1),
)
def test_decoder_matches_the_library_reader(
    compiled: bool, batches: list[tuple[list[Rec], int]], start_frac: float
) -> None:
    """Whatever records, codecs and start offset: the decoded rows are exactly the library's, from
    the start offset on."""
    data, base = b"", 100
    for recs, codec in batches:
        data += build(base, recs, codec)
        base += len(recs)
    start = 100 + int((base - 100) * start_frac)
    expected = [r for r in oracle(data) if r["offset"] >= start]
    assert rows(data, start, compiled) == expected


@pytest.mark.parametrize("compiled", KERNELS)
def test_decoded_memory_is_one_trackable_owner(compiled: bool) -> None:
    """The decode copies records out of the answer, so the answer body no longer accounts for them:
    ``Decoded.held`` names the allocation the Arrow buffers live in and its size (at least the
    values' bytes, compressed or not), which the byte budget tracks by weak reference. It lives
    while any slice of the records does, and dies with the last one."""
    values = [bytes([i]) * 1000 for i in range(40)]
    data = build(0, [(None, v, [("h", b"x")]) for v in values], codec=3)  # lz4: decoded > wire
    d = decode_partition(data, 5, True, tp=TP, compiled=compiled)
    assert d.error is None and len(d.held) == 1
    owner, size = d.held[0]
    assert size >= sum(map(len, values)) > len(data)
    ref = weakref.ref(owner)
    piece = d.batches[0].records.slice(30, 2).column(3)
    del d, owner
    gc.collect()
    assert ref() is not None  # a slice of the values keeps the allocation
    assert piece.to_pylist() == values[35:37]
    del piece
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("compiled", KERNELS)
def test_partial_trailing_batch_is_not_an_error(compiled: bool) -> None:
    """An answer cut inside its last batch (max_bytes) yields the whole batches and no error."""
    a, b = build(0, [(b"k", b"v", [])] * 3), build(3, [(b"k", b"w", [])] * 3)
    d = decode_partition(a + b[:-5], 0, True, tp=TP, compiled=compiled)
    assert d.error is None
    assert [(x.first_offset, x.next_offset) for x in d.batches] == [(0, 3)]


@pytest.mark.parametrize("compiled", KERNELS)
def test_bad_crc_stops_with_the_good_batches_before(compiled: bool) -> None:
    """A flipped byte fails the CRC-32C: the batches before it are returned, the error names the
    topic-partition and the offset."""
    a, b = build(0, [(b"k", b"v", [])] * 2), bytearray(build(2, [(b"k", b"v", [])] * 2))
    b[-1] ^= 0xFF
    d = decode_partition(a + bytes(b), 0, True, tp=TP, compiled=compiled)
    assert d.error is not None and "CRC" in d.error and str(TP) in d.error and "offset 2" in d.error
    assert [(x.first_offset, x.next_offset) for x in d.batches] == [(0, 2)]


@pytest.mark.parametrize("compiled", KERNELS)
def test_malformed_records_are_an_error_not_a_crash(compiled: bool) -> None:
    """Records whose framing lies (checked without CRC, as a broker bug would deliver them) end the
    decode with a clear error and the good batches before them."""
    a = build(0, [(b"k", b"v", [])])
    b = bytearray(build(1, [(b"k", b"value", [])]))
    b[61] = 0x7E  # record length varint: far past the batch
    d = decode_partition(a + bytes(b), 0, False, tp=TP, compiled=compiled)
    assert d.error is not None and "offset 1" in d.error
    assert [(x.first_offset, x.next_offset) for x in d.batches] == [(0, 1)]


def test_magic_1_is_a_clear_error_naming_the_partition() -> None:
    """Old message formats (magic 0/1) are refused with the topic-partition and the offset named."""
    old = bytearray(build(7, [(b"k", b"v", [])]))
    old[16] = 1
    d = decode_partition(bytes(old), 7, True, tp=TP)
    assert d.batches == []
    assert d.error is not None and "magic 1" in d.error and str(TP) in d.error


@pytest.mark.parametrize("compiled", KERNELS)
def test_read_committed_drops_aborted_and_control_batches(compiled: bool) -> None:
    """Producer 5's aborted transaction and both markers are skipped; the committed producer 6 and
    the plain records stay; the offsets still advance past everything."""
    data = (
        build(0, [(None, b"plain", [])])
        + build(1, [(None, b"aborted", [])] * 2, txn=True, pid=5)
        + build(3, [(None, b"committed", [])], txn=True, pid=6)
        + control(4, 5, commit=False)
        + control(5, 6, commit=True)
        + build(6, [(None, b"later", [])], txn=True, pid=5)
        + control(7, 5, commit=True)
    )
    d = decode_partition(data, 0, True, tp=TP, aborted=[AbortedTxn(5, 1)], compiled=compiled)
    assert d.error is None
    values = [r["value"] for r in d.batches[0].records.to_pylist()]
    assert values == [b"plain", b"committed", b"later"]
    assert d.batches[0].next_offset == 8
    # read_uncommitted keeps the aborted records, still skips the markers
    d = decode_partition(data, 0, True, tp=TP, aborted=None, compiled=compiled)
    assert [r["value"] for r in d.batches[0].records.to_pylist()] == [
        b"plain",
        b"aborted",
        b"aborted",
        b"committed",
        b"later",
    ]


def test_only_markers_still_advance_the_position() -> None:
    """An answer holding nothing but a transaction marker yields an empty batch that moves the
    position past it (otherwise the partition would fetch the marker forever)."""
    d = decode_partition(control(10, 5, commit=True), 10, True, tp=TP, aborted=[])
    assert d.error is None
    assert [(b.first_offset, b.next_offset, b.records.num_rows) for b in d.batches] == [(10, 11, 0)]


@pytest.mark.parametrize("compiled", KERNELS)
def test_header_key_not_utf8_is_a_malformed_batch(compiled: bool) -> None:
    """A header key that is not UTF-8 (CRC made right) stops the decode at its batch with a clear
    error instead of an Arrow string column Parquet and Spark would choke on."""
    good = build(0, [(None, b"v", [("ok", b"1")])])
    bad = bytearray(build(1, [(None, b"v", [("ok", b"1")]), (None, b"w", [("k\xc3", b"2")])]))
    at = bytes(bad).rindex(b"k\xc3")
    bad[at + 1] = 0xFF  # "k\xff": not UTF-8
    d = decode_partition(good + recrc(bad), 0, True, tp=TP, compiled=compiled)
    assert (
        d.error is not None
        and "offset 1" in d.error
        and "record 1: a header key is not valid UTF-8" in d.error
    )
    assert [(x.first_offset, x.next_offset) for x in d.batches] == [(0, 1)]


def test_a_cut_control_record_is_a_clear_error() -> None:
    """A transaction marker's type is read with the decoder's own varint reader: every cut of the
    record before its key ends is a RecordBatchError saying what is wrong (an IndexError before);
    whole markers give their type."""
    from mqd.sources.kafka.record_batch import HEADER_SIZE, RecordBatchError, _control_type

    commit, abort = control(0, 7, True)[HEADER_SIZE:], control(0, 7, False)[HEADER_SIZE:]
    assert (_control_type(commit), _control_type(abort)) == (1, 0)
    cuts = []
    for cut in range(len(commit)):
        try:
            assert _control_type(commit[:cut]) == 1
        except RecordBatchError as exc:
            cuts.append(str(exc))
    assert len(cuts) >= 6 and cuts[0] == "control record 0: a record field runs past its record"
    assert "control record key too short" in cuts
