"""The Kafka decoder's entry point (decode_partition) against answers no sound broker sends (issue 31,
items 3 and 4): batches that overlap or go behind each other come out cut to strictly increasing
offsets, counted and logged; any bytes at all give a result (records and an error), never an
exception, and the compiled kernel and the pure fallback give the same one."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fake_kafka import Rec, build, control, recrc, values

from mqd import metrics
from mqd.consumer.source import Decoded
from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.record_batch import HEADER_SIZE, AbortedTxn, batch_heads, decode_partition
from mqd.topic_partition import TopicPartition

TP = TopicPartition("hostile", 0)
KERNELS = [False, *([True] if records_kernel.COMPILED else [])]
COUNTER = "mqd_kafka_out_of_order_records_total"


def cut_count(tp: TopicPartition = TP) -> float:
    labels = {"topic": tp.topic, "partition": str(tp.partition)}
    return metrics.REGISTRY.get_sample_value(COUNTER, labels) or 0.0


def offsets(d: Decoded) -> list[int]:
    return [o for b in d.batches for o in b.records.column("offset").to_pylist()]


def plain(d: Decoded) -> tuple[str | None, list[tuple[int, int, int, list[Any]]]]:
    """The result as Python values, timestamps as their int64 (any int64 may come off the wire,
    beyond what a datetime holds)."""
    out = []
    for b in d.batches:
        cols = [c.cast(pa.int64()) if i == 1 else c for i, c in enumerate(b.records.columns)]
        out.append((b.first_offset, b.next_offset, b.nbytes, [c.to_pylist() for c in cols]))
    return d.error, out


def check_shape(d: Decoded, start: int) -> None:
    """What the engine relies on: batches from ``start`` on, each range following the one before,
    every record inside its batch's range, offsets strictly increasing across the whole answer."""
    at, prev = start, start - 1
    for b in d.batches:
        assert b.first_offset == at and b.next_offset > b.first_offset
        offs = b.records.column("offset").to_pylist()
        assert all(b.first_offset <= o < b.next_offset for o in offs)
        assert all(o > p for p, o in zip([prev, *offs], offs, strict=False))
        prev = offs[-1] if offs else prev
        at = b.next_offset
    assert at < 2**63
    if d.error is not None:
        assert str(TP) in d.error


@pytest.mark.parametrize("compiled", KERNELS)
def test_overlapping_batches_are_cut_counted_and_logged(
    compiled: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """0..9 then 5..14 in one answer (the issue's case: 20 rows, 5 duplicated, no error before):
    0..14 once each, 5..9 as the first batch had them, 5 records counted, one warning naming the
    broker; the position moves to 15."""
    a = values(0, *[b"a%d" % i for i in range(10)])
    b = values(5, *[b"b%d" % i for i in range(5, 15)])
    before = cut_count()
    with caplog.at_level(logging.WARNING):
        d = decode_partition(a + b, 0, True, tp=TP, compiled=compiled, broker="node 1 (127.0.0.1:9)")
    assert d.error is None
    check_shape(d, 0)
    assert offsets(d) == list(range(15))
    got = [v for x in d.batches for v in x.records.column("value").to_pylist()]
    assert got == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10, 15)]
    assert d.batches[-1].next_offset == 15
    assert sum(x.nbytes for x in d.batches) == len(a) + len(b)
    assert cut_count() - before == 5
    lines = [r.getMessage() for r in caplog.records if "overlapping or backward" in r.getMessage()]
    assert len(lines) == 1 and "127.0.0.1:9" in lines[0] and "records_dropped=5" in lines[0], lines


@pytest.mark.parametrize("compiled", KERNELS)
def test_a_batch_behind_the_answer_is_dropped_and_counted(compiled: bool) -> None:
    """5..14 then 0..9 (backwards): 5..14 only, the 10 records behind counted (they were skipped
    without a trace before); the batch before the fetch offset at the head of an answer is not."""
    a, b = values(5, *[b"%d" % i for i in range(5, 15)]), values(0, *[b"%d" % i for i in range(10)])
    before = cut_count()
    d = decode_partition(values(0, b"x", b"y") + a + b, 3, True, tp=TP, compiled=compiled)
    assert d.error is None
    check_shape(d, 3)
    assert offsets(d) == list(range(5, 15)) and d.batches[-1].next_offset == 15
    assert cut_count() - before == 10


def test_batch_heads_end_at_the_highest_batch_end() -> None:
    """The fetch-ahead position (where the engine fetches next before decoding) is where decoding
    leaves the partition: the highest batch end, not the last batch's when it went backwards; a
    batch that moves nothing starts no epoch."""
    a, b = values(0, *[b"a"] * 10, epoch=3), values(2, b"b", epoch=4)
    assert batch_heads(a + b) == ([(0, 3)], 10)
    c = values(5, *[b"c"] * 10, epoch=5)
    assert batch_heads(a + c) == ([(0, 3), (10, 5)], 15)


def test_a_bad_header_key_then_a_malformed_batch_is_an_error_not_an_exception() -> None:
    """Issue 31 item 4's sample: a good batch, a batch whose header key is not UTF-8 (CRC made
    right), then a batch whose record length runs past it. The kernel's scan fails on the third;
    the retry without it fails on the second, which escaped as a KernelError. Now: the good batch
    and the error of the earliest bad batch, for both kernels."""
    good = build(0, [(None, b"v", [("ok", b"1")])])
    bad = bytearray(build(1, [(None, b"v", [("k\xc3", b"2")])]))
    bad[bytes(bad).rindex(b"k\xc3") + 1] = 0xFF
    later = bytearray(build(2, [(b"k", b"value", [])]))
    later[61] = 0x7E  # the record length varint: far past the batch
    data = good + recrc(bad) + recrc(later)
    for compiled in KERNELS:
        d = decode_partition(data, 0, True, tp=TP, compiled=compiled)
        assert d.error is not None and "offset 1" in d.error and "header key is not valid UTF-8" in d.error
        assert [(x.first_offset, x.next_offset) for x in d.batches] == [(0, 1)]


header = st.tuples(st.sampled_from(["h", "é", ""]), st.one_of(st.none(), st.binary(max_size=4)))
record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=4)),
    st.one_of(st.none(), st.binary(max_size=12)),
    st.lists(header, max_size=2),
)
batch = st.tuples(
    st.integers(-3, 40), st.lists(record, min_size=1, max_size=5), st.sampled_from([0, 0, 1, 3])
)


def model(batches: list[tuple[int, list[Rec], int]], start: int) -> tuple[list[int], int]:
    """The offsets kept and the records counted as out of order, batch by batch as the answer
    gives them: a record is kept when it is at or past the highest batch end so far (``start``
    before any), and counted when dropped after some batch was taken."""
    floor, taken, kept, counted = start, False, [], 0
    for base, recs, _ in batches:
        end = base + len(recs)
        if end <= floor:
            counted += len(recs) if taken else 0
            continue
        for i in range(len(recs)):
            if base + i >= floor:
                kept.append(base + i)
            elif taken:
                counted += 1
        floor, taken = end, True
    return kept, counted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(batch, min_size=1, max_size=6), start=st.integers(0, 30))
def test_any_batch_order_gives_increasing_offsets_as_the_model(
    batches: list[tuple[int, list[Rec], int]], start: int
) -> None:
    """Batches at any base offsets, overlapping, repeated or backwards: both kernels keep exactly
    the model's offsets (the first delivery of each, in increasing order), count the model's
    dropped records, and give the same records."""
    data = b"".join(build(base, recs, codec) for base, recs, codec in batches)
    kept, counted = model(batches, start)
    results = []
    for compiled in KERNELS:
        before = cut_count()
        d = decode_partition(data, start, True, tp=TP, compiled=compiled)
        assert d.error is None
        check_shape(d, start)
        assert offsets(d) == kept
        assert cut_count() - before == counted
        results.append(plain(d))
    assert all(r == results[0] for r in results)


# header fields a hostile broker may set to anything (the CRC made right after): base offset,
# batch length, leader epoch, attributes, lastOffsetDelta, base/max timestamp, producer id, count
FIELDS = [
    (0, ">q"),
    (8, ">i"),
    (12, ">i"),
    (21, ">h"),
    (23, ">i"),
    (27, ">q"),
    (35, ">q"),
    (43, ">q"),
    (57, ">i"),
]
_BITS = {">q": 64, ">i": 32, ">h": 16}
damage = st.one_of(
    st.tuples(
        st.just("field"),
        st.integers(0, len(FIELDS) - 1),
        st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1)),
    ),
    st.tuples(st.just("byte"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("utf8"), st.just(0), st.integers(0, 255)),  # after the first "é" lead byte
)


def damaged(one: bytes, hits: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(one)
    for kind, where, value in hits:
        if kind == "field":
            off, fmt = FIELDS[where]
            bits = _BITS[fmt]
            v = (value + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)  # any value the field holds
            struct.pack_into(fmt, b, off, v)
        elif kind == "utf8":
            at = bytes(b).find(b"\xc3", HEADER_SIZE)
            if at > 0:
                b[at + 1] = value
        else:
            b[where % len(b)] = value
    return recrc(b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.tuples(
            batch,
            st.booleans(),  # a transaction marker instead
            st.lists(damage, max_size=2),
        ),
        min_size=1,
        max_size=5,
    ),
    start=st.integers(0, 40),
    cut=st.one_of(st.none(), st.integers(0, 4000)),
    check_crc=st.booleans(),
    aborted=st.one_of(st.none(), st.lists(st.integers(0, 40).map(lambda f: AbortedTxn(5, f)), max_size=2)),
)
def test_the_decode_entry_point_never_raises(
    batches: list[tuple[tuple[int, list[Rec], int], bool, list[tuple[str, int, int]]]],
    start: int,
    cut: int | None,
    check_crc: bool,
    aborted: list[AbortedTxn] | None,
) -> None:
    """Fuzz of decode_partition itself (the kernel has its own checks): batches from the library's
    builder, transactional or markers, with header fields set to any value and bytes overwritten
    (the CRC made right, so the damage reaches past it), the answer cut anywhere. Every input gives
    a Decoded (an exception escaped to the fetcher's catch-all, which never parks the partition),
    shaped as the engine relies on, the same from both kernels."""
    parts = []
    for (base, recs, codec), marker, hits in batches:
        one = control(base, 5, len(recs) % 2 == 0) if marker else build(base, recs, codec, txn=True, pid=5)
        parts.append(damaged(one, hits) if hits else one)
    data = b"".join(parts)
    if cut is not None:
        data = data[:cut]
    results = []
    for compiled in KERNELS:
        d = decode_partition(data, start, check_crc, tp=TP, aborted=aborted, compiled=compiled)
        check_shape(d, start)
        results.append(plain(d))
    assert all(r == results[0] for r in results)
