"""A process frozen while it holds a landing lock stalls no partition (issue 12, case 6; issue 15).

Before: a new owner resolved start positions one ``flock`` at a time, with no bound, so a daemon
frozen inside the publication lock (a stopped VM) stalled every partition it had taken over for as
long as it was frozen. On the claim chain (landing format 3) neither resolving a start position
nor publishing takes a lock; the one lock left, the swap of a partition's idle-watermark record, is
bounded and only delays that record. So with partition 0's lock held by a stopped process, every
partition lands in full, exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.daemon import assert_exactly_once, daemon_config, landed, produce_numbered
from support.harness import Cluster

from mqd import fsutil, metrics
from mqd.consumer import TopicPartition
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until, wait_until_sync
from mqd.wire.client import BrokerClient

PARTITIONS = 3
PER_PARTITION = 300

_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding partition 0's publication lock, then stopped (SIGSTOP) inside it."""
    lock = tmp_path / "landing" / "_state" / "events" / ".00000.json.lock"  # its idle-watermark swap
    lock.parent.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock)], text=True)
    try:
        wait_until_sync(lambda: _held(lock), 30, "the holder has the lock")
        os.kill(proc.pid, signal.SIGSTOP)  # frozen inside the lock, like a stopped VM
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)


def _held(lock: Path) -> bool:
    """Another process holds ``lock`` (one non-blocking try)."""
    try:
        with fsutil.locked(lock, timeout=0):
            return False
    except fsutil.LockTimeout:
        return True


def _retries() -> float:
    return metrics.REGISTRY.get_sample_value("mqd_start_position_retries_total") or 0.0


def _landed_per_partition(root: Path) -> dict[int, int]:
    return dict(Counter(int(p) for p in landed(root)[:, 0]))


async def test_a_frozen_lock_holder_stalls_no_partition(
    cluster_factory: Callable[..., Cluster], tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    """A stopped process holds partition 0's only landing lock: every partition, 0 included, is
    assigned and lands in full while it is frozen, exactly once."""
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=100)
        daemon = Daemon(daemon_config(cluster, tmp_path, max_age=0.2))
        stop = asyncio.Event()
        run = asyncio.create_task(daemon.run(stop.wait()))
        try:
            root = tmp_path / "landing"
            await wait_until(
                lambda: _landed_per_partition(root) == dict.fromkeys(range(PARTITIONS), PER_PARTITION),
                60,
                "every partition landed while partition 0's lock is held",
            )
            assert TopicPartition("events", 0) in daemon.consumer.assignment()
            assert holder.poll() is None  # still frozen, still holding it
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
        assert_exactly_once(tmp_path / "landing", PARTITIONS, PER_PARTITION)
