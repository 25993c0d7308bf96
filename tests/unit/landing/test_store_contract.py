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
from support.landing import stage as stage_table

from mqd.landing import layout
from mqd.landing.errors import PublishConflict
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import file_range
from mqd.landing.stage_writer import StagedFile
from mqd.landing.store import LandingStore
from mqd.wire import format as fmt

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


def stage(
    store: LandingStore, partition: int, first: int, count: int, ts: int = T0, inc: str | None = None
) -> StagedFile:
    raw = fmt.encode_batch([b"v"] * count, timestamps=np.full(count, ts, dtype=np.int64), base_offset=first)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range("t", partition, records, inc)
    return stage_table(store, layout.landing_table("t", partition, records, inc), rng, "snappy")


OLD, NEW = "a" * 32, "b" * 32  # two incarnations of one partition's log


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


def test_a_new_incarnation_lands_its_reused_offsets_as_new_records(store: LandingStore) -> None:
    """0..9 landed under OLD; the log became NEW and reuses offsets from 4. NEW's 4..9 commit
    (expected end: OLD's 9) as a file of their own name, the head moves to (NEW, 9), and both
    files stay visible and in the manifest with their incarnations."""
    old = store.commit(stage(store, 2, 0, 10, inc=OLD), None)
    new = store.commit(stage(store, 2, 4, 6, inc=NEW), 9, OLD)
    assert old.path != new.path and OLD in old.path and NEW in new.path
    assert sorted(store.visible_files()) == sorted([old.path, new.path])
    assert [(r.incarnation, r.first_offset, r.last_offset) for r in store.manifest("t")] == [
        (OLD, 0, 9),
        (NEW, 4, 9),
    ]
    head = store.head("t", 2)
    assert (head.incarnation, head.last_offset, head.files) == (NEW, 9, 2)


def test_the_landed_incarnation_is_part_of_the_condition(store: LandingStore) -> None:
    """A publisher still on OLD (a stale owner) loses against NEW's landed end even with the same
    offset, and learns the landed incarnation; within one incarnation offsets must still grow."""
    store.commit(stage(store, 3, 0, 10, inc=OLD), None)
    store.commit(stage(store, 3, 4, 6, inc=NEW), 9, OLD)
    with pytest.raises(PublishConflict) as stale:
        store.commit(stage(store, 3, 10, 5, inc=OLD), 9, OLD)
    assert (stale.value.last_offset, stale.value.incarnation) == (9, NEW)
    with pytest.raises(PublishConflict):
        store.commit(stage(store, 3, 5, 5, inc=NEW), 9, NEW)  # a replay of NEW's own offsets
    store.commit(stage(store, 3, 10, 5, inc=NEW), 9, NEW)
    assert store.head("t", 3).last_offset == 14


def test_an_unknown_landed_incarnation_assumes_no_reuse(store: LandingStore) -> None:
    """Files landed before incarnations (None) and the first known incarnation after them: its
    records must start after the landed end, never reuse it (format 1's behaviour)."""
    store.commit(stage(store, 4, 0, 10), None)
    with pytest.raises(PublishConflict):
        store.commit(stage(store, 4, 5, 5, inc=NEW), 9, None)
    store.commit(stage(store, 4, 10, 5, inc=NEW), 9, None)
    head = store.head("t", 4)
    assert (head.incarnation, head.last_offset) == (NEW, 14)
