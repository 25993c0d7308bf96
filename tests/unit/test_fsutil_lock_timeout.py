"""fsutil.locked with a timeout: a bounded wait for a flock another holder keeps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqd import fsutil


def test_locked_times_out_while_another_holder_keeps_the_lock(tmp_path: Path) -> None:
    """A second open of the lock file (its own flock) cannot take it while the first holds it: the
    bounded wait raises a retriable LockTimeout naming the file, after about the bound, not forever."""
    lock = tmp_path / "sub" / "p.lock"
    with fsutil.locked(lock):
        start = time.monotonic()
        with pytest.raises(fsutil.LockTimeout, match=r"p\.lock") as info, fsutil.locked(lock, timeout=0.2):
            pass
        assert 0.15 <= time.monotonic() - start < 5.0
        assert info.value.retriable


def test_locked_with_timeout_takes_a_free_lock_and_releases_it(tmp_path: Path) -> None:
    """A free lock is taken at once with any bound, 0 included, and released on exit, so the next
    bounded taker gets it too."""
    lock = tmp_path / "p.lock"
    with fsutil.locked(lock, timeout=0):
        assert lock.exists()
    with fsutil.locked(lock, timeout=0.5):
        pass
