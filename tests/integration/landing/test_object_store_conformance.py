"""Conformance of the S3 store to the conditional writes the claim chain relies on (SeaweedFS
4.48 through two gateways on one filer, i.e. two machines): single-part create-only
(``If-None-Match: *``) and ``If-Match`` puts pick exactly one winner, also when the racers go
through different gateways; and the object store's start-up probe refuses a store that ignores
them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.seaweedfs import fresh_uri, object_store, s3_objects

from mqd.landing.errors import PreconditionFailed, UnsafeObjectStore
from mqd.landing.objects import ObjectInfo, Objects
from mqd.landing.store import LandingStore
from mqd.testing.seaweedfs import SeaweedFS

RACERS = 2  # threads per gateway (SeaweedFS backs off ~1 s per lost lock: keep rounds short)
ROUNDS = 10


def race(n: int, attempt: Callable[[int], str | None]) -> list[int]:
    """Run ``attempt(i)`` for i in 0..n-1 at once (a barrier releases them together); the indexes
    whose attempt succeeded."""
    barrier = threading.Barrier(n)
    won: list[int] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            if attempt(i) is not None:
                won.append(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return won


def test_create_only_put_has_one_winner_across_two_gateways(seaweedfs: SeaweedFS) -> None:
    """4 writers (2 per gateway) create the same key with If-None-Match: *, 10 times: exactly one
    succeeds each time, the others get 412, and the stored body is the winner's."""
    uri = fresh_uri(seaweedfs)
    gws = [s3_objects(seaweedfs, uri, 0), s3_objects(seaweedfs, uri, 1)]
    for r in range(ROUNDS):
        key = f"race/create-{r}"

        def attempt(i: int, key: str = key) -> str | None:
            try:
                return gws[i % 2].put(key, f"writer-{i}".encode(), if_absent=True)
            except PreconditionFailed:
                return None

        won = race(2 * RACERS, attempt)
        assert len(won) == 1, f"round {r}: winners {won}"
        got = gws[1 - won[0] % 2].get(key)
        assert got is not None and got[0] == f"writer-{won[0]}".encode()


def test_if_match_put_has_one_winner_across_two_gateways(seaweedfs: SeaweedFS) -> None:
    """4 writers update one object with If-Match on the same etag: one wins each round; a put
    with a stale etag, or If-Match on a missing key, is refused and writes nothing."""
    uri = fresh_uri(seaweedfs)
    gws = [s3_objects(seaweedfs, uri, 0), s3_objects(seaweedfs, uri, 1)]
    etag = gws[0].put("race/cas", b"v0", if_absent=True)
    for r in range(ROUNDS):
        base = etag

        def attempt(i: int, base: str = base, r: int = r) -> str | None:
            try:
                return gws[i % 2].put("race/cas", f"r{r}-writer-{i}".encode(), if_match=base)
            except PreconditionFailed:
                return None

        won = race(2 * RACERS, attempt)
        assert len(won) == 1, f"round {r}: winners {won}"
        got = gws[0].get("race/cas")
        assert got is not None and got[0] == f"r{r}-writer-{won[0]}".encode()
        etag = got[1]
    with pytest.raises(PreconditionFailed):
        gws[1].put("race/cas", b"stale", if_match=base)
    with pytest.raises(PreconditionFailed):
        gws[1].put("race/missing", b"x", if_match=etag)
    assert gws[0].head("race/missing") is None


class IgnoresConditions:
    """A store that drops the conditions and overwrites, as s3rver and some proxies do."""

    def __init__(self, inner: Objects) -> None:
        self.inner = inner

    @property
    def location(self) -> str:
        return self.inner.location

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        return self.inner.put(key, data)

    def upload(self, key: str, path: Path) -> None:
        self.inner.upload(key, path)

    def get(self, key: str) -> tuple[bytes, str] | None:
        return self.inner.get(key)

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def copy(self, src: str, dst: str) -> bool:
        return self.inner.copy(src, dst)

    def list_objects(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list_objects(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def test_probe_accepts_seaweedfs_and_refuses_a_store_ignoring_conditions(seaweedfs: SeaweedFS) -> None:
    """open() passes on SeaweedFS and leaves only the landing's format marker behind; on a store
    that overwrites despite If-None-Match it raises a non-retriable UnsafeObjectStore naming the
    problem."""
    uri = fresh_uri(seaweedfs)
    store = object_store(seaweedfs, uri)
    assert [o.key for o in store.objects.list_objects("")] == ["_format.json"]
    bad = LandingStore(IgnoresConditions(s3_objects(seaweedfs, uri)))
    with pytest.raises(UnsafeObjectStore, match="If-None-Match") as err:
        bad.open()
    assert not err.value.retriable
