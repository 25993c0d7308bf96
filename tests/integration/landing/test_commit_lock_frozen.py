"""A frozen (SIGSTOPped) publisher does not stall another owner of its partition (issue 12, "no
owner can be stalled by a frozen one"; issue 15, the claim chain on the local store).

Format 2 committed under a per-partition ``flock``: a publisher frozen inside its commit (a stopped
VM) stalled every other writer of that partition for as long as it was frozen. On the claim chain
no lock is held across a publication: a publisher frozen right after its claim is completed by the
next reader of the head, the other owner publishes on, and the frozen one, when it wakes, finds its
file already visible and lands nothing twice. The one lock left (the swap of a small bookkeeping
record, local_objects.py) is bounded: a frozen holder makes the other's write give up with a
retriable error, counted, and never touches publication.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqd import fsutil, metrics
from mqd.landing import LocalStore, layout
from mqd.landing.publisher import Publisher
from mqd.waiting import wait_until_sync
from mqd.wire import format as fmt

BOUND_S = 0.5  # the store's swap-lock bound in this test
CALL_LIMIT_S = 10.0  # every call must return well before this (the frozen one stays frozen longer)

_RECORDS = """
def records(first, n):
    import time
    import numpy as np
    import pyarrow as pa
    from mqd.wire import format as fmt
    raw = fmt.encode_batch(
        [b"v%d" % i for i in range(first, first + n)],
        timestamps=np.full(n, time.time_ns() // 1_000_000, dtype=np.int64),
        base_offset=first,
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
"""

_FREEZE_AFTER_CLAIM = (
    _RECORDS
    + """
import os, signal, sys
from pathlib import Path
from mqd.landing.local_objects import LocalObjects
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher

class FreezeOnPromotion(LocalObjects):
    def copy(self, src, dst):
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen right after its claim, before its promotion
        return super().copy(src, dst)

root = Path(sys.argv[1])
store = LocalStore(root)
store.objects = FreezeOnPromotion(root)
rng = Publisher(store).publish("t", 0, records(10, 5), 9)
print(rng.first_offset, rng.last_offset, flush=True)
"""
)

_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def records(first: int, n: int) -> pa.Table:
    raw = fmt.encode_batch(
        [b"v%d" % i for i in range(first, first + n)],
        timestamps=np.full(n, time.time_ns() // 1_000_000, dtype=np.int64),
        base_offset=first,
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "T"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)


def _offsets(store: LocalStore) -> Counter[int]:
    seen: Counter[int] = Counter()
    for key in store.visible_files():
        got = store.objects.get(key)
        assert got is not None
        seen.update(pq.read_table(io.BytesIO(got[0]), columns=["offset"]).column("offset").to_pylist())
    return seen


def test_a_publisher_frozen_after_its_claim_does_not_stall_the_other_owner(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A process claims 10..14 and is SIGSTOPped before promoting its file. Another owner reads
    the head at once (the reader promotes the frozen one's file), publishes 15..19 after it, all
    within the bound; the frozen process, continued, reports its range landed, and every offset
    0..19 is visible exactly once and in the manifest."""
    root = tmp_path / "landing"
    store = LocalStore(root, commit_lock_timeout=BOUND_S)
    store.open()
    Publisher(store).publish("t", 0, records(0, 10), None)
    frozen = subprocess.Popen(
        [sys.executable, "-c", _FREEZE_AFTER_CLAIM, str(root)], stdout=subprocess.PIPE, text=True, env=_env()
    )
    procs.append(frozen)
    wait_until_sync(lambda: _stopped(frozen.pid), 60, "the publisher froze after its claim")
    other = LocalStore(root, commit_lock_timeout=BOUND_S)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        assert pool.submit(lambda: other.head("t", 0).last_offset).result(timeout=CALL_LIMIT_S) == 14
        rng = pool.submit(Publisher(other).publish, "t", 0, records(15, 5), 14).result(timeout=CALL_LIMIT_S)
        assert time.monotonic() - started < CALL_LIMIT_S
    assert (rng.first_offset, rng.last_offset) == (15, 19)
    frozen.send_signal(signal.SIGCONT)
    out, _err = frozen.communicate(timeout=60)
    assert frozen.returncode == 0 and out.split() == ["10", "14"]
    seen = _offsets(other)
    assert sorted(seen) == list(range(20)) and set(seen.values()) == {1}
    assert sorted(r.path for r in other.manifest("t")) == other.visible_files()


def _timeouts() -> float:
    return metrics.REGISTRY.get_sample_value("mqd_landing_lock_timeouts_total", {"operation": "swap"}) or 0.0


def test_a_frozen_holder_of_a_swap_lock_bounds_the_watermark_write_and_never_blocks_a_commit(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """A SIGSTOPped process holds the swap lock of partition 0's idle-watermark record: the other
    daemon's watermark write gives up within the bound with a retriable LockTimeout (counted),
    while its commits of that partition go on; once the holder is gone the write succeeds."""
    root = tmp_path / "landing"
    store = LocalStore(root, commit_lock_timeout=BOUND_S)
    store.open()
    store.advance_watermark("t", 0, 1)  # the record exists: the next write is a swap
    lock = root / layout.topic_state_dir("t") / ".00000.json.lock"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    procs.append(holder)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGSTOP)
    before = _timeouts()
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        with pytest.raises(fsutil.LockTimeout) as info:
            pool.submit(store.advance_watermark, "t", 0, 2).result(timeout=CALL_LIMIT_S)
        assert time.monotonic() - started < CALL_LIMIT_S and info.value.retriable
        rng = pool.submit(Publisher(store).publish, "t", 0, records(0, 5), None).result(timeout=CALL_LIMIT_S)
    assert _timeouts() == before + 1
    assert store.head("t", 0).last_offset == rng.last_offset == 4
    holder.send_signal(signal.SIGCONT)
    holder.kill()
    holder.wait(timeout=10)
    store.advance_watermark("t", 0, time.time_ns() // 1_000_000 + 1)
    assert store.head("t", 0).watermark_ms is not None
