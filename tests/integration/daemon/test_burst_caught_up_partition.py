"""In a burst, a partition at its log end is finished at once (mqd/process/daemon.py
``_finish_caught_up``): its file does not wait for the other partitions' backlog, and its records no
longer pin the fetch answers they came in. Before, every open file was finished together when the
last partition caught up (or at ``max_age``): in the ``hot`` bench shape the eleven small partitions
were encoded and fsynced after partition 0's last fetch, on the burst's critical path.

The order of publication is read from the files' modification times (one filesystem, nanoseconds),
not from a clock in the test: partition 0 holds 10 records, partition 1 is fetched ~150 records an
answer and lands 60 files one after another, and ``max_age`` (60 s) never falls due."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support.cli import write_config
from support.daemon import landed
from support.harness import Cluster

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

SMALL, BIG, PER_FILE = 10, 30_000, 500


async def _produce(client: BrokerClient, cluster: Cluster, partition: int, count: int) -> None:
    url = cluster.url(cluster.master(cluster.broker_group_of(partition)))
    for lo in range(0, count, 1000):
        n = min(1000, count - lo)
        await client.produce(url, "events", partition, fmt.encode_batch([b"x" * 100] * n))


def _mtimes(landing: Path, partition: int) -> list[int]:
    return sorted(
        p.stat().st_mtime_ns
        for p in landing.rglob("*.parquet")
        if not any(x.startswith(("_", ".")) for x in p.relative_to(landing).parts)
        and p.name.startswith(f"part-{partition:05d}-")
    )


async def test_a_partition_at_its_log_end_is_published_while_the_burst_goes_on(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Partition 0's one file is published before most of partition 1's 60 (before: after all of
    them but those finished with it at the end), and every record lands once."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await _produce(client, cluster, 0, SMALL)
        await _produce(client, cluster, 1, BIG)
    # partition 1 comes in answers of ~150 records, no more than the landing has room for: its
    # fetching spans its 60 files
    cfg = write_config(
        tmp_path,
        cluster,
        consumer={"partition_max_bytes": 16_384, "fetch_max_bytes": 32_768, "max_buffered_bytes": 131_072},
        landing={"max_records": PER_FILE, "max_age": 60.0},
    )
    res = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg), "--burst"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    landing = tmp_path / "landing"
    small, big = _mtimes(landing, 0), _mtimes(landing, 1)
    assert len(small) == 1 and len(big) == BIG // PER_FILE, (len(small), len(big))
    assert small[0] < statistics.median(big), (small, big[0], big[-1])
    rows = sorted(map(tuple, landed(landing).tolist()))
    assert rows == [(0, o) for o in range(SMALL)] + [(1, o) for o in range(BIG)]
