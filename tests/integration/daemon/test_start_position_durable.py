"""A start position resolved from consume_from is durable before anything is fetched (issue 12.5).

With ``consume_from = "last"`` the position depends on when it is resolved. A daemon killed -9
after resolving it and before its first publication left it neither committed nor in the landing,
so the next run resolved "last" again and skipped everything produced in between. Here a real
daemon process is killed at that moment while records keep arriving; the next run must land every
record produced after the first resolution.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cli import produce, write_config
from support.harness import Cluster, fetch_all
from support.landing import read_manifest

from mqd.waiting import wait_until_sync

PARTITIONS = 4


def _config(tmp_path: Path, cluster: Cluster) -> Path:
    # nothing is published by age or size while the test looks: the kill comes first
    return write_config(
        tmp_path,
        cluster,
        consumer={"consume_from": "last", "session_timeout": 3.0},
        landing={"max_age": 120.0},
    )


def _produce(cluster: Cluster, count: int) -> None:
    produce(cluster, count, batch=50)


def _log_ends(cluster: Cluster) -> dict[int, int]:
    ends = {}
    for p in range(PARTITIONS):
        records = fetch_all(cluster.url(cluster.master(cluster.broker_group_of(p))), "events", p)
        ends[p] = records[-1][0] + 1 if records else 0
    return ends


def _pending(state: Path) -> int:
    try:
        info = json.loads((state / "admin.json").read_text())
        with urllib.request.urlopen(f"{info['url']}/status", timeout=5) as resp:
            st = json.loads(resp.read())
    except (OSError, ValueError, KeyError):
        return -1
    return int((st.get("landing") or {}).get("pending_records", -1))


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": PARTITIONS})


@pytest.fixture
def daemon_pids() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_kill_after_resolving_last_before_first_publication_loses_nothing(
    tmp_path: Path, cluster: Cluster, daemon_pids: list[subprocess.Popen[bytes]]
) -> None:
    """kill -9 between the resolution of "last" and the first publication, records arriving
    before and after the kill: the next run lands every record produced after the resolution."""
    _produce(cluster, 400)  # history that "last" rightly skips
    cfg = _config(tmp_path, cluster)
    state = tmp_path / "state"
    run_log = tmp_path / "run.log"
    with open(run_log, "wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    daemon_pids.append(daemon)
    wait_until_sync(
        lambda: "start positions" in run_log.read_text() and _pending(state) == 0,
        timeout=30,
        what="start positions resolved, the daemon serving its status",
    )
    resolved = _log_ends(cluster)  # nothing was produced since the resolution
    _produce(cluster, 600)
    wait_until_sync(lambda: _pending(state) == 600, timeout=30, what="600 records buffered, unpublished")
    daemon.kill()  # SIGKILL: no drain, no final commit
    daemon.wait(timeout=10)
    assert not list((tmp_path / "landing").rglob("*.parquet")), "published before the kill"
    _produce(cluster, 300)  # records keep arriving while no daemon runs
    ends = _log_ends(cluster)

    # a plain run (not --burst): the killed member holds half the partitions until its session ends
    with open(tmp_path / "run2.log", "wb") as out:
        again = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MQD_LANDING__MAX_AGE": "0.3"},
        )
    daemon_pids.append(again)
    total = sum(ends[p] - resolved[p] for p in range(PARTITIONS))
    wait_until_sync(
        lambda: sum(r.last_offset - r.first_offset + 1 for r in read_manifest(tmp_path / "landing")) >= total,
        timeout=60,
        what=f"{total} records landed",
    )
    again.terminate()
    assert again.wait(timeout=30) == 0
    landed: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
    for r in read_manifest(tmp_path / "landing"):
        landed[r.partition].append((r.first_offset, r.last_offset))
    for p in range(PARTITIONS):
        spans = sorted(landed[p])
        assert spans, f"partition {p}: nothing landed, expected [{resolved[p]}, {ends[p]})"
        assert spans[0][0] == resolved[p], f"partition {p}: landing starts at {spans[0][0]}"
        for (_, last), (first, _) in itertools.pairwise(spans):
            assert first == last + 1, f"partition {p}: gap or overlap at {first}"
        assert spans[-1][1] == ends[p] - 1, f"partition {p}: landing ends at {spans[-1][1]}"
