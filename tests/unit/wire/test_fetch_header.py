"""The fetch answer's JSON header as mqd.wire.protocol.FetchAnswerHeader: what the broker writes is what
a client reads back, the JSON on the wire is the one the broker wrote before it was typed, and a
malformed header is refused with a ProtocolError that names the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.wire.incarnation import IncarnationEntry
from mqd.wire.protocol import (
    FetchAnswerHeader,
    PartitionHeader,
    ProtocolError,
    Status,
    decode_fetch_answer,
    frame_fetch_answer,
)

INC = "9f1c2e0a4b7d4e8f9a0b1c2d3e4f5a6b"
OTHER = "0" * 32

ids = st.text("0123456789abcdef", min_size=32, max_size=32)
offsets = st.integers(min_value=0, max_value=2**63 - 1)
maybe_offset = st.none() | offsets
names = st.text(min_size=1, max_size=20)


@st.composite
def histories(draw: st.DrawFn) -> tuple[IncarnationEntry, ...]:
    keys = draw(st.lists(ids, min_size=1, max_size=4, unique=True))
    bases = sorted(draw(st.lists(offsets, min_size=len(keys), max_size=len(keys))))
    return tuple(IncarnationEntry(k, b) for k, b in zip(keys, bases, strict=True))


@st.composite
def headers(draw: st.DrawFn) -> tuple[FetchAnswerHeader, list[bytes]]:
    chunks = draw(st.lists(st.binary(max_size=16), max_size=6))
    parts, pos = [], 0
    for chunk in chunks:
        parts.append(
            PartitionHeader(
                topic=draw(names),
                partition=draw(st.integers(min_value=0, max_value=2**31 - 1)),
                status=draw(st.sampled_from(Status)),
                next_offset=draw(offsets),
                min_offset=draw(offsets),
                max_offset=draw(offsets),
                suggest=draw(st.none() | names),
                error=draw(st.none() | st.text(max_size=30)),
                incarnation=draw(st.none() | ids),
                diverged_at=draw(maybe_offset),
                lost_first=draw(maybe_offset),
                lost_last=draw(maybe_offset),
                history=draw(st.none() | histories()),
                pos=pos,
                length=len(chunk),
            )
        )
        pos += len(chunk)
    return FetchAnswerHeader(draw(names), tuple(parts)), chunks


@given(headers())
def test_a_header_reads_back_as_written(case: tuple[FetchAnswerHeader, list[bytes]]) -> None:
    header, chunks = case
    assert FetchAnswerHeader.from_json(header.to_json()) == header
    answer = decode_fetch_answer(b"".join([*frame_fetch_answer(header, chunks), *chunks]))
    assert answer.node == header.node
    assert len(answer.partitions) == len(header.partitions)
    for got, sent, chunk in zip(answer.partitions, header.partitions, chunks, strict=True):
        assert bytes(got.data) == chunk
        assert (got.topic, got.partition, got.status, got.suggest, got.error) == (
            sent.topic,
            sent.partition,
            sent.status,
            sent.suggest,
            sent.error,
        )
        assert (got.next_offset, got.min_offset, got.max_offset) == (
            sent.next_offset,
            sent.min_offset,
            sent.max_offset,
        )
        assert (got.incarnation, got.diverged_at, got.lost_first, got.lost_last) == (
            sent.incarnation,
            sent.diverged_at,
            sent.lost_first,
            sent.lost_last,
        )
        assert got.history == (None if sent.history is None else list(sent.history))


def test_the_wire_json_is_the_one_the_dict_header_gave() -> None:
    """Byte for byte what the broker wrote when its header was a dict (keys in the same order, an
    absent field left out): a partition it does not serve, one whose incarnation changed, one in a
    lost range, and a replica's entry with its history and a slice of data."""
    header = FetchAnswerHeader(
        "n1",
        (
            PartitionHeader(
                "t",
                0,
                Status.NOT_SERVED,
                next_offset=0,
                min_offset=0,
                max_offset=0,
                error="unknown_partition",
            ),
            PartitionHeader(
                "t", 1, Status.INCARNATION_CHANGED, 3, 0, 9, suggest="n2", incarnation=INC, diverged_at=3
            ),
            PartitionHeader("t", 2, Status.DATA_LOST, 8, 0, 20, incarnation=INC, lost_first=4, lost_last=7),
            PartitionHeader(
                "t",
                3,
                Status.FOUND,
                5,
                0,
                9,
                incarnation=INC,
                history=(IncarnationEntry(OTHER, 0), IncarnationEntry(INC, 2)),
                pos=0,
                length=5,
            ),
        ),
    )
    legacy = {
        "node": "n1",
        "partitions": [
            {
                "topic": "t",
                "partition": 0,
                "status": "NOT_SERVED",
                "next_offset": 0,
                "min_offset": 0,
                "max_offset": 0,
                "suggest": None,
                "error": "unknown_partition",
                "pos": 0,
                "len": 0,
            },
            {
                "topic": "t",
                "partition": 1,
                "status": "INCARNATION_CHANGED",
                "next_offset": 3,
                "min_offset": 0,
                "max_offset": 9,
                "suggest": "n2",
                "incarnation": INC,
                "diverged_at": 3,
                "pos": 0,
                "len": 0,
            },
            {
                "topic": "t",
                "partition": 2,
                "status": "DATA_LOST",
                "next_offset": 8,
                "min_offset": 0,
                "max_offset": 20,
                "suggest": None,
                "incarnation": INC,
                "lost_first": 4,
                "lost_last": 7,
                "pos": 0,
                "len": 0,
            },
            {
                "topic": "t",
                "partition": 3,
                "status": "FOUND",
                "next_offset": 5,
                "min_offset": 0,
                "max_offset": 9,
                "suggest": None,
                "incarnation": INC,
                "history": [{"id": OTHER, "base": 0}, {"id": INC, "base": 2}],
                "pos": 0,
                "len": 5,
            },
        ],
    }
    assert header.to_json() == json.dumps(legacy, separators=(",", ":")).encode()


GOOD = {
    "topic": "t",
    "partition": 0,
    "status": "FOUND",
    "next_offset": 1,
    "min_offset": 0,
    "max_offset": 1,
    "suggest": None,
    "pos": 0,
    "len": 0,
}


def raw(**changes: object) -> bytes:
    entry = {k: v for k, v in {**GOOD, **changes}.items() if v is not ...}
    return json.dumps({"node": "n", "partitions": [entry]}).encode()


def test_unknown_keys_are_ignored_and_null_optionals_are_absent() -> None:
    header = FetchAnswerHeader.from_json(raw(future_field=[1], error=None, incarnation=None))
    assert header.partitions[0] == PartitionHeader("t", 0, Status.FOUND, 1, 0, 1)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        (b"\xff", "not JSON"),
        (b"[]", "expected an object, got list"),
        (b'{"partitions": []}', "node: missing"),
        (b'{"node": 1, "partitions": []}', "node: expected str"),
        (b'{"node": "n", "partitions": {}}', "partitions: expected list"),
        (b'{"node": "n", "partitions": [1]}', r"partitions\[0\]: expected an object"),
        (raw(topic=...), r"partitions\[0\].topic: missing"),
        (raw(topic=7), r"partitions\[0\].topic: expected str, got 7"),
        (raw(partition="0"), r"partitions\[0\].partition: expected int"),
        (raw(partition=True), r"partitions\[0\].partition: expected int, got True"),
        (raw(next_offset=1.5), r"partitions\[0\].next_offset: expected int"),
        (raw(status="LOST"), r"partitions\[0\].status: unknown status 'LOST'"),
        (raw(status=None), r"partitions\[0\].status: expected str"),
        (raw(suggest=3), r"partitions\[0\].suggest: expected str"),
        (raw(diverged_at="3"), r"partitions\[0\].diverged_at: expected int"),
        (raw(len=...), r"partitions\[0\].len: missing"),
        (raw(pos=-1), r"partitions\[0\]: negative slice"),
        (raw(history=[{"id": "x", "base": 0}]), r"partitions\[0\].history: .*bad incarnation id"),
        (raw(history={}), r"partitions\[0\].history: history must be a list"),
    ],
)
def test_a_malformed_header_is_refused_naming_the_field(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        FetchAnswerHeader.from_json(body)


def test_a_malformed_header_in_an_answer_is_a_protocol_error() -> None:
    head = raw(status="LOST")
    body = b"MQF1" + len(head).to_bytes(4, "little") + head
    with pytest.raises(ProtocolError, match="unknown status"):
        decode_fetch_answer(body)


def test_a_slice_past_the_data_is_refused() -> None:
    header = FetchAnswerHeader("n", (PartitionHeader("t", 0, Status.FOUND, 1, 0, 1, pos=0, length=9),))
    with pytest.raises(ProtocolError, match="slice out of range"):
        decode_fetch_answer(b"".join([*frame_fetch_answer(header, [b"x" * 9]), b"x" * 8]))


def test_the_broker_cannot_frame_a_header_whose_slices_are_not_its_chunks() -> None:
    header = FetchAnswerHeader("n", (PartitionHeader("t", 0, Status.FOUND, 1, 0, 1, pos=0, length=4),))
    with pytest.raises(ValueError, match="slice 0\\+4, its chunk is 0\\+3"):
        frame_fetch_answer(header, [b"abc"])
