"""The record-size rule (mqd/record_size.py): one definition of a record's size, checked without
a Python object per record."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.record_size import RecordTooLarge, oversize, record_sizes
from mqd.wire import format as fmt
from mqd.wire.format import check_record_sizes

record = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),
    st.binary(max_size=60),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=3),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(record, min_size=1, max_size=20), st.integers(0, 19))
def test_sizes_are_key_value_and_headers_bytes(
    recs: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]], start: int
) -> None:
    """For any records (null keys, empty and several headers), also in a batch sliced at a start
    offset, each size is len(key) + len(value) + the UTF-8 bytes of every header key and value."""
    keys, values, headers = [r[0] for r in recs], [r[1] for r in recs], [r[2] for r in recs]
    raw = fmt.encode_batch(values, keys=keys, headers=headers, base_offset=100)
    start = min(start, len(recs) - 1)
    batch = fmt.to_arrow(raw, fmt.scan(raw)[0], 100 + start)
    want = [
        len(k or b"") + len(v) + sum(len(hk.encode()) + len(hv) for hk, hv in h) for k, v, h in recs[start:]
    ]
    assert record_sizes(batch).tolist() == want


def test_check_batches_names_the_record_by_its_place_in_the_request() -> None:
    """The first record over the limit is named by its index across the request's batches; a
    batch whose bytes are within the limit is accepted without looking into it."""
    a = fmt.encode_batch([b"x" * 10, b"y" * 10])
    b = fmt.encode_batch([b"z" * 5, b"w" * 500, b"v" * 600])
    body = a + b
    infos = fmt.validate(body)
    check_record_sizes(body, infos, 600)
    with pytest.raises(RecordTooLarge, match=r"record 3 of the request \(from 0\) is 500 bytes") as err:
        check_record_sizes(body, infos, 499)
    assert (err.value.size, err.value.limit, err.value.retriable) == (500, 499, False)


def test_oversize_gives_the_offset_of_a_fetched_record() -> None:
    """In a fetched (decoded) batch the oversized record is named by its log offset."""
    raw = fmt.encode_batch([b"a", b"b" * 300, b"c"], base_offset=40)
    batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
    assert oversize(batch, len(raw), 299) == (41, 300)
    assert oversize(batch, len(raw), 300) is None
    assert oversize(batch, 299, 299) is None  # a batch within the limit is not looked into
