"""Fetch v12/v13 answers parsed in place (mqd.sources.kafka.fetch_answer) against aiokafka's own
struct decoding of the same bytes as the oracle: every field equal, the records views of the
answer (no copy), and anything cut short or followed by stray bytes refused with MalformedAnswer."""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.sources.kafka.fetch_answer import MalformedAnswer, parse_fetch_answer
from mqd.sources.kafka.frame_reader import RawAnswer, answer_buffer
from mqd.sources.kafka.protocol_ext import FetchResponse_v12, FetchResponse_v13, fetched_partitions

CORRELATION = 7
i16 = st.integers(-(2**15), 2**15 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
tags = st.dictionaries(st.integers(0, 300), st.binary(max_size=20), max_size=2)
partition = st.tuples(
    i32,
    i16,
    i64,
    i64,
    i64,
    st.one_of(st.none(), st.lists(st.tuples(i64, i64, tags), max_size=3)),
    i32,
    st.one_of(st.none(), st.binary(max_size=300)),
    tags,
)


def topic_key(version: int) -> st.SearchStrategy[str]:
    return st.binary(min_size=16, max_size=16).map(bytes.hex) if version == 13 else st.text(max_size=12)


@st.composite
def answers(draw: st.DrawFn) -> tuple[int, tuple[Any, ...]]:
    version = draw(st.sampled_from([12, 13]))
    topics = draw(st.lists(st.tuples(topic_key(version), st.lists(partition, max_size=4), tags), max_size=3))
    return version, (draw(i32), draw(i16), draw(i32), topics, draw(tags))


def frame(version: int, fields: tuple[Any, ...]) -> bytes:
    """The answer as a broker sends it after the size prefix: correlation id, no header tags, body."""
    cls = FetchResponse_v13 if version == 13 else FetchResponse_v12
    body: bytes = cls(*fields).encode()
    return struct.pack(">i", CORRELATION) + b"\x00" + body


def oracle(version: int, data: bytes) -> Any:
    cls = FetchResponse_v13 if version == 13 else FetchResponse_v12
    bio = BytesIO(data)
    bio.read(5)
    return cls.decode(bio)


def plain(value: Any) -> Any:
    """Views and tuples as bytes and lists, nulls of arrays as empty: what both sides mean alike."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(answers())
def test_every_field_equals_aiokafkas_decoding(answer: tuple[int, tuple[Any, ...]]) -> None:
    """Top-level fields, each topic and each partition tuple (aborted transactions, preferred
    replica, records, tags) parse as aiokafka decodes them; records are views of the body."""
    version, fields = answer
    raw = frame(version, fields)
    data = answer_buffer(len(raw))  # as the connection reads it
    data[:] = memoryview(raw)
    owner: object = data
    got = parse_fetch_answer(RawAnswer(version, data))
    want = oracle(version, bytes(data))
    assert (got.API_VERSION, got.throttle_time_ms, got.error_code, got.session_id) == (
        version,
        want.throttle_time_ms,
        want.error_code,
        want.session_id,
    )
    norm = [[t, [[*p[:5], p[5] or [], *p[6:]] for p in parts]] for t, parts, _tags in plain(want.topics)]
    assert plain(got.topics) == norm
    for _key, parts in got.topics:
        for p in parts:
            if p[7] is not None:
                assert isinstance(p[7], memoryview) and p[7].obj is owner  # no copy
    names = {t: f"name-{t}" for t, _ in got.topics}
    assert len(fetched_partitions(got, names)) == sum(len(p) for _t, p in got.topics)


@settings(max_examples=100, deadline=None)
@given(answers(), st.data())
def test_a_cut_answer_or_stray_bytes_are_refused(
    answer: tuple[int, tuple[Any, ...]], data: st.DataObject
) -> None:
    """Every proper prefix of an answer is refused, and so is an answer with bytes after its end:
    the walk never reads past the buffer or accepts less than the whole answer."""
    version, fields = answer
    full = frame(version, fields)
    cut = data.draw(st.integers(4, len(full) - 1))
    with pytest.raises(MalformedAnswer):
        parse_fetch_answer(RawAnswer(version, full[:cut]))
    with pytest.raises(MalformedAnswer, match="after the answer's end"):
        parse_fetch_answer(RawAnswer(version, full + b"\x00"))


def test_other_versions_are_not_parsed_in_place() -> None:
    """Only v12 and v13 requests ask for raw answers; anything else is a clear error."""
    with pytest.raises(MalformedAnswer, match="v11"):
        parse_fetch_answer(RawAnswer(11, b"\x00" * 16))
