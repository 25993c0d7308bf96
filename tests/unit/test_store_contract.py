"""The storage seam's contract (mqd.landing.store), checked through the interface only, here on the
local store: a staged file is invisible until committed; a commit is conditional on the previous
end and a lost race reveals the landed end; the head, manifest and visible files agree. Written
against ``LandingStore``: it runs on the local store and on the object store (S3, on the session's
SeaweedFS)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mqd import format as fmt
from mqd.landing import layout
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import file_range
from mqd.landing.store import LandingStore, PublishConflict, StagedFile

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _object_store(request: pytest.FixtureRequest, tmp_path: Path) -> LandingStore:
    from support.seaweedfs import object_store  # the S3 store on the session's SeaweedFS

    return object_store(request.getfixturevalue("seaweedfs"))


def _local_store(request: pytest.FixtureRequest, tmp_path: Path) -> LandingStore:
    s = LocalStore(tmp_path / "landing")
    s.open()
    return s


STORES: dict[str, Callable[[pytest.FixtureRequest, Path], LandingStore]] = {
    "local": _local_store,
    "object": _object_store,
}


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LandingStore:
    return STORES[request.param](request, tmp_path)


def stage(store: LandingStore, partition: int, first: int, count: int, ts: int = T0) -> StagedFile:
    raw = fmt.encode_batch([b"v"] * count, timestamps=np.full(count, ts, dtype=np.int64), base_offset=first)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range("t", partition, records)
    return store.stage(layout.landing_table("t", partition, records), rng, "snappy")


def test_staged_is_invisible_and_commit_makes_it_visible_once(store: LandingStore) -> None:
    """Before commit nothing is visible or in the head; after it the file is visible, in the
    manifest and the head, with its size."""
    staged = stage(store, 0, 0, 10)
    assert store.visible_files() == [] and store.head("t", 0).last_offset is None
    rng = store.commit(staged, None)
    store.discard(staged)
    assert rng.bytes > 0 and (rng.first_offset, rng.last_offset, rng.count) == (0, 9, 10)
    assert store.visible_files() == [rng.path]
    assert store.manifest() == [rng] and store.manifest("t") == [rng] and store.manifest("other") == []
    head = store.head("t", 0)
    assert (head.last_offset, head.files, head.watermark_ms) == (9, 1, T0)


def test_a_lost_race_reveals_the_landed_end_and_lands_nothing(store: LandingStore) -> None:
    """Two owners stage the same range; the first commit wins, the second gets PublishConflict
    with the winner's end, and so does a commit whose expected end is stale."""
    a, b = stage(store, 1, 0, 10), stage(store, 1, 0, 10)
    store.commit(a, None)
    with pytest.raises(PublishConflict) as lost:
        store.commit(b, None)
    store.discard(b)
    assert lost.value.last_offset == 9 and lost.value.expected is None
    nxt = stage(store, 1, 10, 5)
    with pytest.raises(PublishConflict) as stale:
        store.commit(nxt, 3)
    assert stale.value.last_offset == 9
    store.commit(nxt, 9)
    assert [(r.first_offset, r.last_offset) for r in store.manifest("t")] == [(0, 9), (10, 14)]
    assert len(store.visible_files()) == 2 and store.head("t", 1).last_offset == 14


def test_watermarks_advance_only(store: LandingStore) -> None:
    """A watermark moves forward only; unknown partitions have none."""
    store.commit(stage(store, 0, 0, 1), None)
    store.advance_watermark("t", 0, T0 + 10)
    store.advance_watermark("t", 0, T0 + 5)
    assert store.watermarks("t", 2) == [T0 + 10, None]
