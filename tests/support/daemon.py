"""Helpers for the daemon's tests: a fast daemon config on a test cluster, producing numbered
records, the committed offsets, and the exactly-once check of a landing directory."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from mqd.config import (
    AdminConfig,
    ConsumerConfig,
    DaemonSection,
    LandingConfig,
    MqdConfig,
)
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from support.consumer import FAST
from support.harness import Cluster

_ids = itertools.count()

FAST_CONSUMER: dict[str, Any] = {**FAST, "consume_from": "first"}
TEST_MAX_AGE_S = 5.0  # landing.max_age of test daemons that set none (the old default; the daemon's is 60 s)


def daemon_config(
    cluster: Cluster, root: Path, *, consumer: dict[str, Any] | None = None, **landing: Any
) -> MqdConfig:
    return MqdConfig(
        consumer=ConsumerConfig(
            **{
                **FAST_CONSUMER,
                "group": "landing",
                "client_id": f"d{next(_ids)}-{time.monotonic_ns() % 10**6}",
                "bootstrap": [cluster.bootstrap],
                "topics": ["events"],
                "offset_file": root / "state" / "offsets.json",
                **(consumer or {}),
            }
        ),
        # tests land within seconds: the daemon's default max_age (60 s) is for large files
        landing=LandingConfig(dir=root / "landing", **{"max_age": TEST_MAX_AGE_S, **landing}),
        admin=AdminConfig(enabled=False),
        daemon=DaemonSection(
            state_dir=root / "state",
            pid_file=root / "state/mqd.pid",
            log_file=root / "state/mqd.log",
            shutdown_timeout=10.0,
        ),
    )


async def produce_numbered(
    client: BrokerClient,
    cluster: Cluster,
    partitions: int,
    per_partition: int,
    *,
    start: int = 0,
    per_batch: int = 1000,
    timestamp: int | None = None,
) -> None:
    for p in range(partitions):
        url = cluster.url(cluster.master(cluster.broker_group_of(p)))
        for lo in range(start, start + per_partition, per_batch):
            n = min(per_batch, start + per_partition - lo)
            raw = fmt.encode_batch(
                [b"%d:%d" % (p, i) for i in range(lo, lo + n)],
                timestamps=None if timestamp is None else [timestamp] * n,
            )
            await client.produce(url, "events", p, raw)


async def committed(client: BrokerClient, cluster: Cluster, group: str) -> dict[int, int]:
    """The group's committed offsets per partition, asked from its coordinator (any master)."""
    last: Exception | None = None
    for g in range(len(cluster.group_names)):
        try:
            rows = await client.committed(cluster.url(cluster.master(g)), group)
        except BrokerError as exc:  # 421 not_coordinator
            last = exc
            continue
        return {int(r["partition"]): int(r["offset"]) for r in rows}
    raise AssertionError(f"no coordinator answered: {last}")


def landed(root: Path) -> np.ndarray:
    """(partition, offset) of every record in every landing data file, one row each."""
    parts: list[np.ndarray] = []
    for path in sorted(root.rglob("*.parquet")):
        if any(x.startswith(("_", ".")) for x in path.relative_to(root).parts):
            continue
        t = pq.read_table(path, columns=["partition", "offset"])
        parts.append(
            np.stack(
                [t.column("partition").to_numpy().astype(np.int64), t.column("offset").to_numpy()], axis=1
            )
        )
    return np.concatenate(parts) if parts else np.empty((0, 2), dtype=np.int64)


def assert_exactly_once(root: Path, partitions: int, per_partition: int) -> None:
    rows = landed(root)
    uniq = np.unique(rows, axis=0)
    assert len(rows) == len(uniq), f"{len(rows) - len(uniq)} duplicate records in landing files"
    expected = np.array([(p, o) for p in range(partitions) for o in range(per_partition)])
    assert len(uniq) == len(expected) and (uniq == expected).all(), "records lost"
