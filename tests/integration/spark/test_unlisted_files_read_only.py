"""The job's start-time listing of files no claim names (mqd/spark/job.py ``unlisted_files``) reads
the landing without writing: a publication a daemon left half done (its file visible, its staged
copy not yet deleted) stays as it was, and on a read-only landing the listing works. Found by
``make chaos`` (seed 162376): a streaming job restarted while the landing was read-only died at
start on EROFS, because the listing resolved each chain's head, which finishes such a publication."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.half_claims import claim_unpromoted

from mqd.landing.local_store import LocalStore
from mqd.spark.job import unlisted_files


@pytest.fixture
def half_done(tmp_path: Path) -> tuple[Path, str]:
    """A landing whose one publication is promoted (visible) but whose staged copy remains."""
    landing = tmp_path / "landing"
    landing.mkdir()
    store = LocalStore(landing)
    store.open()
    rng, staged = claim_unpromoted(store, "t", 0)
    store.objects.copy(staged, rng.path)
    assert store.objects.head(rng.path) is not None and store.objects.head(staged) is not None
    return landing, staged


def test_the_listing_leaves_a_half_done_publication_as_it_was(half_done: tuple[Path, str]) -> None:
    landing, staged = half_done
    assert unlisted_files(landing) == []  # the promoted file is its claim's: listed as published
    assert LocalStore(landing).objects.head(staged) is not None  # nothing finished, nothing deleted


@pytest.fixture
def read_only(half_done: tuple[Path, str]) -> Iterator[Path]:
    """The landing bind-mounted read-only over itself (root only; unmounted after the test)."""
    landing, _ = half_done
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    if subprocess.run(["mount", "--bind", str(landing), str(landing)], capture_output=True).returncode:
        pytest.skip("mount --bind is not permitted here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(landing)], check=True, capture_output=True)
        yield landing
    finally:
        subprocess.run(["umount", str(landing)], check=False, capture_output=True)


def test_the_listing_works_on_a_read_only_landing(read_only: Path) -> None:
    """Before the fix: ObjectStoreError (EROFS) from deleting the staged copy."""
    assert unlisted_files(read_only) == []
