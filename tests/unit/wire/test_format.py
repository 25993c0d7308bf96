"""The record batch format: what goes in comes out, and bad bytes are refused, never half-read."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.records import RECORD_SCHEMA
from mqd.wire import format as fmt
from mqd.wire.protocol import ProtocolError, Status, decode_fetch_answer, encode_fetch_answer

records = st.lists(
    st.tuples(
        st.binary(max_size=64),
        st.one_of(st.none(), st.binary(max_size=16)),
        st.integers(min_value=0, max_value=2**41),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(records, st.integers(min_value=0, max_value=2**40))
def test_round_trip_through_arrow(
    recs: list[tuple[bytes, bytes | None, int, list[tuple[str, bytes]]]], base: int
) -> None:
    """Any records survive encode -> broker offset assignment -> zero-copy Arrow view unchanged."""
    values = [r[0] for r in recs]
    keys = [r[1] for r in recs]
    ts = [r[2] for r in recs]
    headers = [r[3] for r in recs]
    raw = bytearray(fmt.encode_batch(values, keys=keys, timestamps=ts, headers=headers))
    fmt.set_base_offset(raw, 0, base)
    infos = fmt.validate(bytes(raw))
    assert len(infos) == 1 and infos[0].base_offset == base and infos[0].count == len(recs)
    assert infos[0].length % 8 == 0 and infos[0].max_timestamp == max(ts)
    rb = fmt.to_arrow(bytes(raw), infos[0])
    assert rb.equals(fmt.to_arrow(bytes(raw), infos[0], deep_check=False))  # the trusted fast path
    assert rb.schema == RECORD_SCHEMA
    assert rb.column("offset").to_pylist() == list(range(base, base + len(recs)))
    assert rb.column("value").to_pylist() == values
    assert rb.column("key").to_pylist() == keys
    assert rb.column("timestamp").cast(pa.int64()).to_pylist() == ts
    got_headers = [[(h["key"], h["value"]) for h in hs] for hs in rb.column("headers").to_pylist()]
    assert got_headers == headers


def test_start_offset_cuts_records_below_it() -> None:
    """A fetch may return a batch that starts before the requested offset; the view starts at it."""
    raw = bytearray(fmt.encode_batch([b"a", b"b", b"c", b"d"]))
    fmt.set_base_offset(raw, 0, 10)
    info = fmt.read_header(bytes(raw))
    rb = fmt.to_arrow(bytes(raw), info, start_offset=12)
    assert rb.column("offset").to_pylist() == [12, 13]
    assert rb.column("value").to_pylist() == [b"c", b"d"]


def test_arrow_input_encodes_without_python_lists() -> None:
    """Producers can hand a pyarrow array (vectorised path); sliced arrays are re-based."""
    arr = pa.array([b"x" * i for i in range(20)]).slice(5, 10)
    raw = fmt.encode_batch(arr)
    rb = fmt.to_arrow(raw, fmt.validate(raw)[0])
    assert rb.column("value").to_pylist() == arr.to_pylist()


def test_base_offset_rewrite_keeps_crc_valid() -> None:
    raw = bytearray(fmt.encode_batch([b"v"] * 3))
    for base in (0, 1, 2**50):
        fmt.set_base_offset(raw, 0, base)
        fmt.check_crc(bytes(raw), fmt.read_header(bytes(raw)))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:-8],  # truncated
        lambda b: b"XXXX" + b[4:],  # bad magic
        lambda b: b[:60] + bytes([b[60] ^ 0xFF]) + b[61:],  # flipped body byte -> CRC
        lambda b: b[:4] + struct.pack("<I", 7) + b[8:],  # length not a multiple of 8
        lambda b: b[:20] + struct.pack("<I", 0) + b[24:],  # zero records
    ],
)
def test_corrupt_batches_are_refused(mutate: Callable[[bytes], bytes]) -> None:
    raw = fmt.encode_batch([b"hello", b"world"], keys=[b"k", None])
    with pytest.raises(fmt.BatchError):
        fmt.validate(mutate(raw))


def test_offsets_inconsistent_with_length_refused_even_with_good_crc() -> None:
    """A producer cannot smuggle in offsets pointing outside the batch: layout is checked after CRC."""
    raw = bytearray(fmt.encode_batch([b"abc", b"def"]))
    n = 2
    k_off = fmt.HEADER_SIZE + 16  # after timestamps
    v_off = k_off + 16  # key offsets int32[3] padded to 16
    struct.pack_into("<i", raw, v_off + 8, 1000)  # last value offset far beyond the data
    import zlib

    struct.pack_into("<I", raw, 16, zlib.crc32(bytes(raw[fmt.CRC_FROM :])))
    assert n == 2
    with pytest.raises(fmt.BatchError):
        fmt.validate(bytes(raw))


def test_scan_valid_prefix_stops_at_torn_tail() -> None:
    a = fmt.encode_batch([b"1"])
    b = fmt.encode_batch([b"2", b"3"])
    buf = a + b + b[:30]
    infos, good = fmt.scan_valid_prefix(buf)
    assert [i.count for i in infos] == [1, 2]
    assert good == len(a) + len(b)


def test_fetch_answer_framing_round_trip() -> None:
    """Batches come back as views at the right place, after the 8-aligned JSON head."""
    b1 = fmt.encode_batch([b"x"])
    b2 = fmt.encode_batch([b"y", b"z"])
    entries = [
        {
            "topic": "t",
            "partition": 0,
            "status": "FOUND",
            "next_offset": 1,
            "min_offset": 0,
            "max_offset": 1,
            "suggest": None,
        },
        {
            "topic": "t",
            "partition": 1,
            "status": "OFFSET_OVERFLOW_ONE",
            "next_offset": 2,
            "min_offset": 0,
            "max_offset": 2,
            "suggest": "n2",
        },
        {
            "topic": "t",
            "partition": 2,
            "status": "FOUND",
            "next_offset": 2,
            "min_offset": 0,
            "max_offset": 2,
            "suggest": None,
        },
    ]
    body = b"".join(encode_fetch_answer("n1", entries, [b1, b"", b2]))
    ans = decode_fetch_answer(body)
    assert ans.node == "n1"
    assert [p.status for p in ans.partitions] == [Status.FOUND, Status.OFFSET_OVERFLOW_ONE, Status.FOUND]
    assert bytes(ans.partitions[0].data) == b1 and bytes(ans.partitions[2].data) == b2
    assert ans.partitions[1].suggest == "n2"
    data_start = len(body) - len(b1) - len(b2)
    assert data_start % 8 == 0
    for bad in (body[:5], b"ZZZZ" + body[4:], body[: data_start + 3]):
        with pytest.raises(ProtocolError):
            decode_fetch_answer(bad)


def test_offset_column_is_vectorised() -> None:
    """The offset column is an arange over the batch, not a per-record list."""
    raw = bytearray(fmt.encode_batch([b"v"] * 1000))
    fmt.set_base_offset(raw, 0, 5000)
    rb = fmt.to_arrow(bytes(raw), fmt.read_header(bytes(raw)))
    np.testing.assert_array_equal(rb.column("offset").to_numpy(), np.arange(5000, 6000))
