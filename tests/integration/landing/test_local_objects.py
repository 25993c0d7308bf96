"""Conformance of a local directory (LocalObjects) to the object primitives the claim chain relies
on (objects.py): a create-only put and an If-Match put pick exactly one winner among processes; a
put is all or nothing for a reader; the etags of get and put agree and a weak (listing) etag never
matches; copy shares the bytes; listings skip temp and lock files; the store's start-up probe
accepts it."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from mqd.landing.errors import PreconditionFailed
from mqd.landing.local_objects import LocalObjects
from mqd.landing.local_store import LocalStore

WRITERS = 4
ROUNDS = 10


def _create(root: str, key: str, i: int, start: Any, out: Any) -> None:
    start.wait(30)
    try:
        LocalObjects(Path(root)).put(key, f"writer-{i}".encode(), if_absent=True)
        out.put(i)
    except PreconditionFailed:
        out.put(-1)


def _swap(root: str, key: str, etag: str, r: int, i: int, start: Any, out: Any) -> None:
    start.wait(30)
    try:  # a body unique to the round: etags compare content, as S3's do
        LocalObjects(Path(root)).put(key, f"round-{r}-writer-{i}".encode(), if_match=etag)
        out.put(i)
    except PreconditionFailed:
        out.put(-1)


def _race(target: Any, args: tuple[Any, ...]) -> list[int]:
    """Run ``target(*args, i, start, out)`` in WRITERS processes released together; the winners."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, start, out)) for i in range(WRITERS)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return [r for r in results if r >= 0]


def test_create_only_put_has_one_winner_among_processes(tmp_path: Path) -> None:
    """4 processes create the same key create-only, 10 times: exactly one succeeds each time, and
    the stored body is the winner's."""
    objects = LocalObjects(tmp_path)
    for r in range(ROUNDS):
        key = f"race/create-{r}.json"
        won = _race(_create, (str(tmp_path), key))
        assert len(won) == 1
        got = objects.get(key)
        assert got is not None and got[0] == f"writer-{won[0]}".encode()


def test_if_match_put_has_one_winner_among_processes(tmp_path: Path) -> None:
    """4 processes swap the same key against the same etag, 10 times: exactly one succeeds, the
    body is the winner's, and its etag is the one get returns."""
    objects = LocalObjects(tmp_path)
    key = "race/swap.json"
    objects.put(key, b"start")
    for r in range(ROUNDS):
        got = objects.get(key)
        assert got is not None
        won = _race(_swap, (str(tmp_path), key, got[1], r))
        assert len(won) == 1
        after = objects.get(key)
        assert after is not None and after[0] == f"round-{r}-writer-{won[0]}".encode()


def test_primitives(tmp_path: Path) -> None:
    """put/get/head/copy/list/delete as objects.py says, on files."""
    objects = LocalObjects(tmp_path / "root")
    etag = objects.put("a/b/one.json", b"1", if_absent=True)
    assert objects.get("a/b/one.json") == (b"1", etag)
    with pytest.raises(PreconditionFailed):
        objects.put("a/b/one.json", b"2", if_absent=True)
    with pytest.raises(PreconditionFailed):
        objects.put("a/b/missing.json", b"2", if_match=etag)
    info = objects.head("a/b/one.json")
    assert info is not None and info.size == 1
    with pytest.raises(PreconditionFailed):  # a weak etag never matches
        objects.put("a/b/one.json", b"2", if_match=info.etag)
    etag2 = objects.put("a/b/one.json", b"22", if_match=etag)
    assert objects.get("a/b/one.json") == (b"22", etag2)
    assert objects.copy("a/b/one.json", "c/two.json")
    assert os.path.samefile(tmp_path / "root/a/b/one.json", tmp_path / "root/c/two.json")
    assert not objects.copy("a/b/none.json", "c/three.json")
    (tmp_path / "root/a/b/.one.json.x.tmp").write_bytes(b"partial")  # a writer's temp file
    assert [o.key for o in objects.list_objects("a/")] == ["a/b/one.json"]
    assert [o.key for o in objects.list_objects("", start_after="a/b/one.json")] == ["c/two.json"]
    assert objects.list_dirs("") == ["a/", "c/"]
    objects.delete("a/b/one.json")
    objects.delete("a/b/one.json")
    assert objects.get("a/b/one.json") is None and objects.head("a/b/one.json") is None
    assert not (tmp_path / "root/a/b/.one.json.lock").exists()  # its swap lock went with it
    assert objects.get("c/two.json") == (b"22", etag2)
    with pytest.raises(ValueError):
        objects.get("../outside")


def test_probe_accepts_a_local_directory(tmp_path: Path) -> None:
    """The object store's start-up probe (create-only and If-Match refused when they must be)
    passes on a local directory and leaves nothing behind but the format marker."""
    store = LocalStore(tmp_path / "landing")
    store.open()
    left = sorted(p.relative_to(tmp_path / "landing").as_posix() for p in (tmp_path / "landing").rglob("*"))
    assert [p for p in left if p.startswith("_staging/") and not p.endswith(".scratch")] == []
    assert "_format.json" in left
