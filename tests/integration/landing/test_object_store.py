"""The object store's protocol cases one at a time, on SeaweedFS: a lost claim response read back
by its nonce, a crash after the claim completed by the next reader of the head, a publisher that
slept past the janitor (its claim is voided and the range lands again, never skipped), the janitor
never removing what a pending claim needs, and retention that keeps a durable floor."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.landing import stage as stage_table
from support.seaweedfs import fresh_uri, s3_objects

from mqd.landing import layout
from mqd.landing.claim_chain import ChainState, Claim
from mqd.landing.errors import LandingFormatError, ObjectStoreError, PublishConflict
from mqd.landing.objects import ObjectInfo, Objects
from mqd.landing.publisher import file_range
from mqd.landing.stage_writer import StagedFile
from mqd.landing.store import LandingStore
from mqd.testing.seaweedfs import SeaweedFS
from mqd.wire import format as fmt

T0 = 1_767_225_600_000


class Died(BaseException):
    """The publisher's process ended here."""


class Scripted:
    """Real objects, with one scripted fault: ``fault(op, key)`` is asked after each operation
    took effect and may raise (a lost response, a crash)."""

    def __init__(self, inner: Objects, fault: Callable[[str, str], None]) -> None:
        self.inner = inner
        self.fault = fault

    @property
    def location(self) -> str:
        return self.inner.location

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        etag = self.inner.put(key, data, if_absent=if_absent, if_match=if_match)
        self.fault("put", key)
        return etag

    def upload(self, key: str, path: Path) -> None:
        self.inner.upload(key, path)
        self.fault("upload", key)

    def get(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def copy(self, src: str, dst: str) -> bool:
        ok = self.inner.copy(src, dst)
        self.fault("copy", dst)
        return ok

    def list_objects(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list_objects(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self.fault("delete", key)


def once(op: str, key_part: str, exc: BaseException) -> Callable[[str, str], None]:
    fired = False

    def fault(o: str, key: str) -> None:
        nonlocal fired
        if not fired and o == op and key_part in key:
            fired = True
            raise exc

    return fault


def stage(store: LandingStore, first: int, count: int, partition: int = 0) -> StagedFile:
    raw = fmt.encode_batch(
        [f"v{first + i}".encode() for i in range(count)],
        timestamps=np.full(count, T0, dtype=np.int64),
        base_offset=first,
    )
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range("t", partition, records)
    return stage_table(store, layout.landing_table("t", partition, records), rng, "snappy")


@pytest.fixture
def landing(seaweedfs: SeaweedFS) -> tuple[SeaweedFS, str]:
    return seaweedfs, fresh_uri(seaweedfs)


def store_at(landing: tuple[SeaweedFS, str], fault: Callable[[str, str], None] | None = None) -> LandingStore:
    server, uri = landing
    objects: Any = s3_objects(server, uri)
    return LandingStore(Scripted(objects, fault) if fault else objects)


def offsets(store: LandingStore) -> list[tuple[int, int]]:
    return [(r.first_offset, r.last_offset) for r in store.manifest("t")]


def test_a_lost_claim_response_is_read_back_as_a_win(landing: tuple[SeaweedFS, str]) -> None:
    """The claim landed but its answer was lost: the publisher reads the slot back, finds its
    own nonce, and completes; one visible file, head at its end."""
    store = store_at(landing, once("put", "/claims/", ObjectStoreError("lost")))
    rng = store.commit(stage(store, 0, 5), None)
    assert rng.last_offset == 4
    clean = store_at(landing)
    assert clean.visible_files() == [rng.path] and clean.head("t", 0).last_offset == 4


def test_a_crash_after_the_claim_is_completed_by_the_next_reader(landing: tuple[SeaweedFS, str]) -> None:
    """The publisher dies right after its claim: nothing is visible yet, and whoever reads the
    head next (another daemon) promotes the staged file; the dead publisher's range is landed."""
    dying = store_at(landing, once("put", "/claims/", Died()))
    staged = stage(dying, 0, 5)
    with pytest.raises(Died):
        dying.commit(staged, None)
    other = store_at(landing)
    assert other.visible_files() == []  # a claim is not a visible file
    head = other.head("t", 0)
    assert (head.last_offset, head.files) == (4, 1)
    assert other.visible_files() == [staged.range.path] and offsets(other) == [(0, 4)]
    assert list(other.objects.list_objects("_staging/")) == []  # promoted and cleaned


def test_a_publisher_that_slept_past_the_janitor_lands_again(
    landing: tuple[SeaweedFS, str],
) -> None:
    """Staged, then the janitor (age 0) removed the unclaimed object before the claim: the claim
    is voided (counted, logged), commit answers a conflict at the old end, nothing is visible,
    and the same range published again lands once."""
    store = store_at(landing)
    store.commit(stage(store, 0, 3), None)
    slept = stage(store, 3, 4)
    assert store_at(landing).remove_stale(0.0) == 1
    with pytest.raises(PublishConflict) as conflict:
        store.commit(slept, 2)
    assert conflict.value.last_offset == 2 and store.voided == 1
    assert store.head("t", 0).last_offset == 2 and offsets(store) == [(0, 2)]
    assert len(store.visible_files()) == 1
    store.commit(stage(store, 3, 4), 2)
    assert offsets(store) == [(0, 2), (3, 6)] and len(store.visible_files()) == 2


def test_the_janitor_keeps_what_a_pending_claim_needs(landing: tuple[SeaweedFS, str]) -> None:
    """A claim whose promotion has not happened yet (its publisher died) is the head: the
    janitor (age 0) marks its staged object keep instead of deleting it, and the next reader
    of the head promotes it."""
    dying = store_at(landing, once("put", "/claims/", Died()))
    staged = stage(dying, 0, 5)
    with pytest.raises(Died):
        dying.commit(staged, None)
    janitor = store_at(landing)
    assert janitor.remove_stale(0.0) == 0
    assert janitor.objects.head(staged.location) is not None
    assert janitor.head("t", 0).last_offset == 4 and janitor.voided == 0
    assert janitor.visible_files() == [staged.range.path]


def test_retention_keeps_a_floor_that_a_stale_claim_cannot_reopen(landing: tuple[SeaweedFS, str]) -> None:
    """Compaction archives old claims into the manifest and deletes them after writing the
    floor; the manifest and head are unchanged. A claim re-created on a deleted key (a publisher
    that slept through compaction) lies below the floor: readers never see it."""
    store = store_at(landing)
    last = None
    for first in (0, 3, 6, 9):
        last = store.commit(stage(store, first, 3), last).last_offset
    before = offsets(store)
    assert store.compact("t", 0, keep=1) == 3
    chain = store.chain("t", 0)
    assert chain.floor()[0].seq == 2 and chain.read_claim(0) is None
    stale = Claim(0, "stale", ChainState(), ChainState(last_offset=99, files=1), None, None, None, "")
    store.objects.put(chain.claim_key(0), stale.to_bytes(), if_absent=True)  # the key is free again
    fresh = store_at(landing)
    assert offsets(fresh) == before and fresh.head("t", 0).last_offset == 11
    assert fresh.commit(stage(fresh, 12, 2), 11).last_offset == 13


def test_watermarks_and_completeness_markers(landing: tuple[SeaweedFS, str]) -> None:
    """An hour gets its _COMPLETE marker (create-only, once) when every partition's watermark,
    landed or advanced while idle, passed its end; watermarks only move forward."""
    store = store_at(landing)
    store.commit(stage(store, 0, 2, partition=0), None)
    store.commit(stage(store, 0, 2, partition=1), None)
    assert store.watermarks("t", 2) == [T0, T0] and store.update_markers("t", 2) == []
    store.advance_watermark("t", 0, T0 + layout.HOUR_MS)
    store.advance_watermark("t", 0, T0 + 5)  # older: ignored
    assert store.update_markers("t", 2) == []  # partition 1 is still inside the hour
    store.advance_watermark("t", 1, T0 + layout.HOUR_MS + 1)
    assert store.watermarks("t", 2) == [T0 + layout.HOUR_MS, T0 + layout.HOUR_MS + 1]
    hour = layout.hour_dir("t", T0 // layout.HOUR_MS)
    assert store.update_markers("t", 2) == [f"{hour}/{layout.MARKER_NAME}"]
    assert store.update_markers("t", 2) == []
    assert store.objects.head(f"{hour}/{layout.MARKER_NAME}") is not None
    assert len(store.visible_files()) == 2  # the marker is not a data file


def test_a_landing_of_another_format_is_refused(landing: tuple[SeaweedFS, str]) -> None:
    """open() writes the format marker of a new landing once; a marker of another format or
    layout (a local landing copied up, an older mqd) is refused, naming the format."""
    store = store_at(landing)
    store.open()
    store.open()  # its own marker: accepted
    store.objects.put(layout.FORMAT_FILE, b'{"format": 1}')
    with pytest.raises(LandingFormatError, match="landing format 1"):
        store_at(landing).open()


def test_an_event_time_far_ahead_of_the_clock_lands_but_does_not_move_the_watermark(
    landing: tuple[SeaweedFS, str],
) -> None:
    """The watermark rule of the local store (watermark.py) holds on the object store: a file
    stamped two days ahead of the publishing clock lands, and the watermark stays where it was."""
    store = store_at(landing)
    store.commit(stage(store, 0, 2), None)  # T0: in the past, trusted
    ahead = layout.HOUR_MS * 48 + int(time.time() * 1000)
    raw = fmt.encode_batch([b"x"], timestamps=np.array([ahead], dtype=np.int64), base_offset=2)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    staged = stage_table(store, layout.landing_table("t", 0, records), file_range("t", 0, records), "snappy")
    store.commit(staged, 1)
    head = store.head("t", 0)
    assert (head.last_offset, head.files, head.watermark_ms) == (2, 2, T0)
