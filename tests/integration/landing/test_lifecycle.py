"""The landing's lifecycle (mqd/landing/lifecycle.py) on both stores: the cleaner removes exactly
the files every registered query has committed (never the newest of a chain, never with a query
registered but behind), compacts the claim chains without changing the manifest, archives instead
of deleting when asked, and retention expires old uncommitted files with a counter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.landing import stage

from mqd.landing import layout, lifecycle
from mqd.landing.errors import LifecycleConflict
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import file_range
from mqd.landing.store import LandingStore
from mqd.wire import format as fmt

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _object_store(request: pytest.FixtureRequest, tmp_path: Path) -> LandingStore:
    from support.seaweedfs import object_store  # the S3 store on the session's SeaweedFS

    s = object_store(request.getfixturevalue("seaweedfs"))
    assert isinstance(s, LandingStore)
    return s


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


def publish(store: LandingStore, partition: int, files: int, per_file: int = 10) -> list[str]:
    """Land ``files`` consecutive files on partition ``partition``; their paths."""
    paths = []
    last = store.head("t", partition).last_offset
    for _ in range(files):
        first = 0 if last is None else last + 1
        raw = fmt.encode_batch(
            [b"v"] * per_file, timestamps=np.full(per_file, T0, dtype=np.int64), base_offset=first
        )
        records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
        rng = file_range("t", partition, records, None)
        staged = stage(store, layout.landing_table("t", partition, records, None), rng, "snappy")
        paths.append(store.commit(staged, last).path)
        last = rng.last_offset
    return paths


def present(store: LandingStore, paths: list[str]) -> list[bool]:
    return [store.objects.head(p) is not None for p in paths]


def test_clean_removes_exactly_what_every_query_committed(store: LandingStore) -> None:
    """Two registered queries: files go only below the smaller count; the newest file of a chain
    stays even when committed; the manifest (what the s3 source counts in) is unchanged."""
    p0, p1 = publish(store, 0, 5), publish(store, 1, 3)
    before = store.manifest()
    lifecycle.register(store, "main")
    lifecycle.register(store, "quarantine")
    lifecycle.record_committed(store, "main", {"t/0": 5, "t/1": 3}, 0)
    lifecycle.record_committed(store, "quarantine", {"t/0": 2, "t/1": 3}, 0)
    got = lifecycle.Cleaner(store).clean()
    assert got.deleted == 2 + 2 and got.queries == ("main", "quarantine")
    assert present(store, p0) == [False, False, True, True, True]
    assert present(store, p1) == [False, False, True]  # the newest stays
    assert store.manifest() == before
    p0 += publish(store, 0, 1)  # landed after: kept until committed
    lifecycle.record_committed(store, "quarantine", {"t/0": 5, "t/1": 3}, 1)
    assert lifecycle.Cleaner(store).clean().deleted == 3
    assert present(store, p0) == [False] * 5 + [True]


def test_a_registered_query_without_progress_holds_everything_back(store: LandingStore) -> None:
    """No query registered: nothing goes. A registered query that never committed (stopped):
    nothing goes, whatever the others did. Deregistering it releases the files."""
    paths = publish(store, 0, 4)
    assert lifecycle.Cleaner(store).clean().deleted == 0
    lifecycle.register(store, "main")
    lifecycle.register(store, "stopped")
    lifecycle.record_committed(store, "main", {"t/0": 4}, 3)
    assert lifecycle.Cleaner(store).clean().deleted == 0
    assert all(present(store, paths))
    lifecycle.register(store, "main")  # registering again keeps the progress
    assert lifecycle.records(store)["main"].committed == {"t/0": 4}
    assert lifecycle.deregister(store, "stopped") and not lifecycle.deregister(store, "stopped")
    assert lifecycle.Cleaner(store).clean().deleted == 3
    assert present(store, paths) == [False, False, False, True]


def test_clean_compacts_the_chain_and_archives_when_asked(store: LandingStore) -> None:
    """With archive_dir the committed files move there (same relative path); the chain is compacted
    to KEEP_CLAIMS claims with its floor, and the manifest still lists every file."""
    paths = publish(store, 0, lifecycle.KEEP_CLAIMS + 6, per_file=2)
    before = store.manifest()
    lifecycle.register(store, "main")
    lifecycle.record_committed(store, "main", {"t/0": 3}, 0)
    got = lifecycle.Cleaner(store, archive_dir="_archive").clean()
    assert got.archived == 3 and got.deleted == 0 and got.compacted == 6
    assert present(store, paths[:3]) == [False] * 3
    assert present(store, [f"_archive/{p}" for p in paths[:3]]) == [True] * 3
    assert store.chain("t", 0).floor()[0].seq == 5
    assert store.manifest() == before
    assert not any(k.startswith("_archive") for k in store.visible_files())


def test_retention_expires_uncommitted_files_with_a_counter(store: LandingStore) -> None:
    """Retention deletes files older than it that no query committed (counted as expired, never
    as deleted), not younger ones, and never the newest of a chain."""
    paths = publish(store, 0, 3)
    lifecycle.register(store, "behind")
    now = T0 + 10**12  # far in the future: everything is older than the retention
    cleaner = lifecycle.Cleaner(store, retention_ms=3_600_000)
    got = cleaner.clean(now_ms=now)
    assert got.expired == 2 and got.deleted == 0 and cleaner.expired == 2
    assert present(store, paths) == [False, False, True]
    fresh = publish(store, 0, 2)
    assert lifecycle.Cleaner(store, retention_ms=3_600_000).clean().expired == 0  # younger than it
    assert present(store, paths + fresh) == [False, False, True, True, True]
    got = lifecycle.Cleaner(store, retention_ms=3_600_000).clean(now_ms=now)
    assert got.expired == 2  # the old newest and fresh[0]; fresh[1] is the chain's newest now
    assert present(store, fresh) == [False, True]


def test_a_name_registered_with_another_checkpoint_is_refused(store: LandingStore) -> None:
    """Two queries of one name (two tables called alike) with different checkpoints: the second
    registration is refused, so one query's progress can never release the other's files; the
    same checkpoint registers again (a restart) and keeps its progress."""
    lifecycle.register(store, "mqd-events", "/a/ckpt/main")
    lifecycle.record_committed(store, "mqd-events", {"t/0": 2}, 1, "/a/ckpt/main")
    with pytest.raises(LifecycleConflict, match="/a/ckpt/main"):
        lifecycle.register(store, "mqd-events", "/b/ckpt/main")
    lifecycle.register(store, "mqd-events", "/a/ckpt/main")
    assert lifecycle.records(store)["mqd-events"].committed == {"t/0": 2}


def test_a_chain_whose_only_file_is_not_visible_yet_is_left_alone(store: LandingStore) -> None:
    """A chain whose first claim's file is not visible yet (published, promotion pending, as after a
    crash between claim and promotion) has no files to clean: the cleaner passes it by and cleans
    the other chains, instead of failing the whole pass (it read files[-1] of an empty list)."""
    (only,) = publish(store, 0, 1)
    p1 = publish(store, 1, 3)
    store.objects.delete(only)  # the claim stays, its file is not visible: a pending head
    lifecycle.register(store, "main")
    lifecycle.record_committed(store, "main", {"t/0": 1, "t/1": 3}, 0)
    got = lifecycle.Cleaner(store).clean()
    assert got.deleted == 2 and present(store, p1) == [False, False, True]
