"""Landing records and a file streamed through a store's open stage, for the landing's stage tests
(tests/integration/landing/test_stage_streaming.py, test_page_cache_drop.py): ``records`` makes
numbered records of random values as the daemon lands them, ``stream_three_row_groups`` stages
offsets 0..2999 a row group at a time and commits the file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from mqd.landing import layout
from mqd.landing.publisher import file_range
from mqd.landing.store import LandingStore
from mqd.wire import format as fmt

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z


def records(first: int, count: int, size: int = 10) -> pa.Table:
    rng = np.random.default_rng(first)
    raw = fmt.encode_batch(
        [rng.bytes(size) for _ in range(count)],
        timestamps=np.full(count, T0, dtype=np.int64),
        base_offset=first,
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def stream_three_row_groups(store: LandingStore, size: int = 10) -> layout.FileRange:
    """Stage offsets 0..2999 as three row groups through open_stage and commit them."""
    parts = [records(i * 1000, 1000, size) for i in range(3)]
    first = file_range("t", 0, parts[0])
    writer = store.open_stage(first, "snappy")
    for part in parts:
        writer.write(layout.landing_table("t", 0, part))
    whole = file_range("t", 0, pa.concat_tables(parts))
    staged = writer.finish(whole)
    try:
        return store.commit(staged, None)
    finally:
        store.discard(staged)
