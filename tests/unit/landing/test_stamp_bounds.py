"""A file's timestamp bounds without Arrow's compute module (mqd/landing/layout.py ``stamp_bounds``):
the same answer as ``pyarrow.compute.min_max`` on any chunking, nulls and empty chunks included,
and a clear error when there is no timestamp at all."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.landing import layout

TS = pa.timestamp("ms", tz="UTC")
stamps = st.one_of(st.none(), st.integers(min_value=0, max_value=2**50))
chunks = st.lists(st.lists(stamps, max_size=20), min_size=1, max_size=5)


@given(chunks)
def test_stamp_bounds_equal_arrows_min_max(values: list[list[int | None]]) -> None:
    """Any chunking, with nulls and empty chunks: the bounds are min_max's, or an error when every
    value is null."""
    column = pa.chunked_array([pa.array(c, TS) for c in values], type=TS)
    mm = pc.min_max(column.cast(pa.int64()))
    if mm["min"].as_py() is None:
        with pytest.raises(ValueError, match="no timestamp"):
            layout.stamp_bounds(column)
        return
    assert layout.stamp_bounds(column) == (mm["min"].as_py(), mm["max"].as_py())


def test_hour_runs_and_describe_use_the_bounds() -> None:
    """A table within one hour is one run; across two hours two; describe reports the bounds."""
    hour = 3_600_000
    base = 1_767_225_600_000
    stamps = [base + 5, base + 1, base + hour + 2, base + hour + 3]
    table = pa.table(
        {
            "offset": pa.array(range(4), pa.int64()),
            "timestamp": pa.chunked_array([pa.array(stamps[:2], TS), pa.array(stamps[2:], TS)]),
        }
    )
    assert [length for _h, _s, length in layout.hour_runs(table.slice(0, 2))] == [2]
    assert [(start, length) for _h, start, length in layout.hour_runs(table)] == [(0, 2), (2, 2)]
    assert layout.describe("t", 0, table) == (0, 3, 4, base + 1, base + hour + 3)
