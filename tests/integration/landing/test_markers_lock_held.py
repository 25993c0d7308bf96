"""A topic's completeness-marker lock held by a frozen process bounds the marker round (issue 13).

The daemon's working loop awaits its housekeeping (watermarks, markers). Chaos ``lock_freeze``
(seed 21, round 7) froze a daemon holding a topic's ``_markers.lock``: the other daemon's marker
round waited on that flock as long as the freeze lasted, and with it the loop that publishes every
partition, so partitions whose own locks were free landed nothing for 10 s.
"""

from __future__ import annotations

import fcntl
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mqd.fsutil import LockTimeout
from mqd.landing import LocalStore, layout, update_markers

BOUND_S = 5.0  # the marker lock's bound (1 s) with room for a loaded machine


def test_marker_round_gives_up_while_another_process_holds_the_marker_lock(tmp_path: Path) -> None:
    """With the topic's marker lock held elsewhere (another open file: flock treats it as another
    holder), update_markers raises LockTimeout within its bound instead of waiting for the holder;
    once the lock is free the same call runs through."""
    root = tmp_path / "landing"
    store = LocalStore(root)
    store.open()
    hour = time.time_ns() // 1_000_000 // layout.HOUR_MS - 2
    store.advance_watermark("t", 0, (hour + 1) * layout.HOUR_MS)  # partition 0 passed ``hour``
    lock = root / layout.STATE_DIR / "t" / "_markers.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the frozen holder
    with ThreadPoolExecutor(1) as pool:
        try:
            started = time.monotonic()
            call = pool.submit(update_markers, root, "t", 1)
            with pytest.raises(LockTimeout):
                call.result(timeout=BOUND_S)  # on main: waits for the holder
            assert time.monotonic() - started < BOUND_S
        finally:
            os.close(fd)  # releases the flock: a call still waiting on main returns
    assert update_markers(root, "t", 1) == []  # free again: the round runs (no hour folders to mark)
