"""A process frozen inside a partition's publication lock does not stall a commit or a watermark
write for longer than the bound (issue 12, "no owner can be stalled by a frozen one").

Before: ``commit`` and ``advance_watermark`` waited on the partition's flock without a bound, so a
publisher frozen inside a commit (a stopped VM) stalled every other writer of that partition for
as long as it was frozen. Now the wait is bounded: the commit gives up with a retriable
CommitLockTimeout (nothing published, the staged file still the caller's), and once the holder is
gone the same staged file commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mqd import format as fmt
from mqd import fsutil, metrics
from mqd.landing import LocalStore, layout
from mqd.landing.publisher import file_range
from mqd.landing.store import CommitLockTimeout
from mqd.waiting import wait_until_sync

BOUND_S = 0.5  # the store's commit lock bound in this test
CALL_LIMIT_S = 10.0  # the call must return well before this (the holder stays frozen far longer)

_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
time.sleep(600)
"""


def _held(lock: Path) -> bool:
    try:
        with fsutil.locked(lock, timeout=0):
            return False
    except fsutil.LockTimeout:
        return True


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding partition 0's publication lock of topic t, stopped (SIGSTOP) inside it."""
    lock = tmp_path / "landing" / layout.STATE_DIR / "t" / "00000.lock"
    lock.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], text=True)
    try:
        wait_until_sync(lambda: _held(lock), 30, "the holder has the lock")
        os.kill(proc.pid, signal.SIGSTOP)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)


def _records(first: int, n: int) -> pa.Table:
    """Records through the wire format, as the consumer hands them over."""
    raw = fmt.encode_batch(
        [b"v%d" % i for i in range(first, first + n)],
        timestamps=np.full(n, time.time_ns() // 1_000_000, dtype=np.int64),
        base_offset=first,
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def _timeouts(op: str) -> float:
    return metrics.REGISTRY.get_sample_value("mqd_landing_lock_timeouts_total", {"operation": op}) or 0.0


def test_commit_returns_within_the_bound_and_publishes_after_the_holder_is_gone(
    tmp_path: Path, frozen: subprocess.Popen[str]
) -> None:
    """With partition 0's lock held by a SIGSTOPped process, commit raises a retriable
    CommitLockTimeout within the bound (counted), nothing becomes visible and the staged file
    stays; the watermark write gives up the same way. Once the holder is killed the same staged
    file commits and is the partition's head."""
    root = tmp_path / "landing"
    store = LocalStore(root, commit_lock_timeout=BOUND_S)
    store.open()
    records = _records(0, 10)
    rng = file_range("t", 0, records)
    staged = store.stage(layout.landing_table("t", 0, records), rng, "snappy")
    before = _timeouts("commit")
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        call = pool.submit(store.commit, staged, None)
        with pytest.raises(CommitLockTimeout) as info:
            call.result(timeout=CALL_LIMIT_S)  # without the bound: waits as long as the freeze
        assert time.monotonic() - started < CALL_LIMIT_S
        assert info.value.retriable
        assert _timeouts("commit") == before + 1
        w_before = _timeouts("watermark")
        with pytest.raises(fsutil.LockTimeout):
            pool.submit(store.advance_watermark, "t", 0, 1).result(timeout=CALL_LIMIT_S)
        assert _timeouts("watermark") == w_before + 1
    assert store.visible_files() == []
    assert Path(staged.location).exists()
    frozen.send_signal(signal.SIGCONT)
    frozen.kill()
    frozen.wait(timeout=10)
    published = store.commit(staged, None)
    assert store.visible_files() == [published.path]
    assert store.head("t", 0).last_offset == 9
    assert [r.path for r in store.manifest("t")] == [published.path]
