"""A topic's completeness-marker lock held by a frozen process bounds the marker round (issue 13);
on the claim chain (format 3) the only lock left there is the progress record's swap lock.

The daemon's working loop awaits its housekeeping (watermarks, markers). Chaos ``lock_freeze``
(seed 21, round 7) froze a daemon holding a topic's ``_markers.lock``: the other daemon's marker
round waited on that flock as long as the freeze lasted, and with it the loop that publishes every
partition, so partitions whose own locks were free landed nothing for 10 s.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mqd.fsutil import LockTimeout
from mqd.landing import LocalStore, layout

LOCK_S = 1.0  # the store's bound on a swap lock in this test
BOUND_S = 5.0  # that bound with room for a loaded machine


def test_marker_round_gives_up_while_another_process_holds_the_progress_lock(tmp_path: Path) -> None:
    """With the swap lock of the topic's marker progress record held elsewhere (another open file:
    flock treats it as another holder), update_markers raises LockTimeout within its bound instead
    of waiting for the holder; the markers themselves (create-only, no lock) are written; once the
    lock is free the same call moves the progress on."""
    root = tmp_path / "landing"
    store = LocalStore(root, commit_lock_timeout=LOCK_S)
    store.open()
    hour = time.time_ns() // 1_000_000 // layout.HOUR_MS - 2
    progress = root / layout.topic_state_dir("t") / "_markers.json"
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.write_text(json.dumps({"complete_before_hour": hour}))
    (root / layout.hour_dir("t", hour)).mkdir(parents=True)
    store.advance_watermark("t", 0, (hour + 1) * layout.HOUR_MS)  # partition 0 passed ``hour``
    lock = progress.with_name("._markers.json.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the frozen holder
    with ThreadPoolExecutor(1) as pool:
        try:
            started = time.monotonic()
            call = pool.submit(store.update_markers, "t", 1)
            with pytest.raises(LockTimeout):
                call.result(timeout=BOUND_S)  # without the bound: waits for the holder
            assert time.monotonic() - started < BOUND_S
        finally:
            os.close(fd)  # releases the flock
    assert (root / layout.hour_dir("t", hour) / layout.MARKER_NAME).exists()
    assert store.update_markers("t", 1) == []  # free again: the progress moves on
    assert json.loads(progress.read_bytes())["complete_before_hour"] == hour + 1
