"""The landing table across daemon deaths and a fight over partitions (issue 35's done-when).

Real ``mqd run`` processes with landing.table = "delta":

- SIGKILL between publication and commit, ten times: every run lands new records and is killed
  with files published that the table does not hold yet (or, every other run, at whatever point a
  fast committer is at); the next run's committer finds them in the claim chains and commits
  exactly what is missing. After a final burst run, delta-rs, DuckDB and Polars read every record
  once.
- A frozen owner: daemon A is SIGSTOPped holding published but uncommitted files, daemon B takes
  its partitions after A's session expired, lands more and commits A's files too; A resumed
  commits what it believes missing against a log that moved: nothing is lost, nothing twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.cli import write_config
from support.daemon import produce_numbered
from support.harness import Cluster
from support.landing import read_manifest
from support.table_readers import delta_rs_keys, every_reader_keys, offsets

from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

PARTITIONS = 4
KILLS = 10
PER_RUN = 250  # records per partition produced before each run


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(timeout=10)


def _run(
    cfg: Path, log: Path, procs: list[subprocess.Popen[bytes]], *extra: str, **env: str
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    procs.append(p)
    return p


def _landed(root: Path) -> int:
    try:
        return sum(r.count for r in read_manifest(root))
    except FileNotFoundError:
        return 0


def _in_table(root: Path) -> int:
    if not (root / "_delta_log").is_dir():
        return 0
    return len(delta_rs_keys(root))


def _at_least(count: Callable[[Path], int], root: Path, n: int) -> Callable[[], bool]:
    return lambda: count(root) >= n


def _expected(per_partition: int) -> list[tuple[str, int, int]]:
    return sorted(("events", p, o) for p in range(PARTITIONS) for o in range(per_partition))


def _assert_readers_exact(root: Path, per_partition: int) -> None:
    want = _expected(per_partition)
    for reader, keys in every_reader_keys(root).items():
        got = offsets(keys)
        assert len(got) == len(set(got)), f"{reader}: {len(got) - len(set(got))} records twice"
        assert got == want, f"{reader}: {len(got)} records, expected {len(want)}"


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": PARTITIONS}, groups=1)


async def test_sigkill_between_publication_and_commit_ten_times(
    tmp_path: Path, cluster: Cluster, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Ten runs, each killed -9 once all its records are published: on even runs the committer's
    interval is an hour, so the kill always finds published files the table lacks (asserted), and
    the next run must commit them at its start (asserted: the table holds every earlier run's
    records before the next kill); odd runs commit every 0.2 s and die wherever. A final burst run
    commits the rest: the three readers read 10 x 1,000 records, each once."""
    cfg = write_config(
        tmp_path, cluster, consumer={"mode": "broadcast"}, landing={"max_age": 0.3, "table": "delta"}
    )
    root = tmp_path / "landing"
    log = tmp_path / "runs.log"
    async with BrokerClient(request_timeout=20) as client:
        for run in range(KILLS):
            await produce_numbered(client, cluster, PARTITIONS, PER_RUN, start=run * PER_RUN, per_batch=50)
            total = (run + 1) * PER_RUN * PARTITIONS
            slow = run % 2 == 0
            d = _run(cfg, log, procs, MQD_LANDING__DELTA__COMMIT_INTERVAL="3600" if slow else "0.2")
            await wait_until(_at_least(_landed, root, total), 60, f"run {run}: {total} records published")
            if slow:
                # the start's catch-up round committed every earlier run's records, not this run's
                before = run * PER_RUN * PARTITIONS
                await wait_until(_at_least(_in_table, root, before), 30, f"run {run}: earlier runs committed")
                assert _in_table(root) < total, "nothing left uncommitted to kill over"
            d.kill()
            d.wait(timeout=10)
            assert _landed(root) == total
    final = _run(cfg, log, procs, "--burst")
    assert final.wait(timeout=120) == 0, log.read_text()[-3000:]
    _assert_readers_exact(root, KILLS * PER_RUN)


async def test_frozen_owner_resumed_after_its_session_expired(
    tmp_path: Path, cluster: Cluster, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Daemon A publishes 1,000 records and is frozen (SIGSTOP) before committing them; daemon B
    gets every partition once A's session expired, commits A's files and lands 1,000 more; A is
    resumed and runs on (its publications conflict, its commits find the log moved) until both
    stop, and each stop commits what its daemon published. The three readers read the 2,040
    records once each."""
    cfg = write_config(
        tmp_path,
        cluster,
        consumer={"session_timeout": 2.0, "heartbeat_interval": 0.3},
        landing={"max_age": 0.3, "table": "delta"},
    )
    root = tmp_path / "landing"
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_RUN, per_batch=50)
        a = _run(cfg, log_a, procs, MQD_LANDING__DELTA__COMMIT_INTERVAL="3600")
        await wait_until(lambda: _landed(root) >= PER_RUN * PARTITIONS, 60, "A published 1,000")
        a.send_signal(signal.SIGSTOP)
        assert _in_table(root) < PER_RUN * PARTITIONS
        state_b = tmp_path / "state-b"  # a second host: its own pid file and state
        b = _run(
            cfg,
            log_b,
            procs,
            MQD_LANDING__DELTA__COMMIT_INTERVAL="0.3",
            MQD_DAEMON__STATE_DIR=str(state_b),
            MQD_DAEMON__PID_FILE=str(state_b / "mqd.pid"),
            MQD_DAEMON__LOG_FILE=str(state_b / "mqd.log"),
        )
        await wait_until(lambda: _in_table(root) >= PER_RUN * PARTITIONS, 60, "B committed A's files")
        await produce_numbered(client, cluster, PARTITIONS, PER_RUN, start=PER_RUN, per_batch=50)
        await wait_until(lambda: _in_table(root) >= 2 * PER_RUN * PARTITIONS, 60, "B committed 2,000")
        a.send_signal(signal.SIGCONT)  # a zombie: it still believes it owns every partition
        await produce_numbered(client, cluster, PARTITIONS, 10, start=2 * PER_RUN, per_batch=10)
        # A rejoins and may own some partitions again, and it commits only at stop (its
        # interval is an hour): the last 40 are published now, committed by the stops below.
        await wait_until(
            lambda: _landed(root) >= (2 * PER_RUN + 10) * PARTITIONS, 60, "the last 40 published"
        )
        for p in (a, b):
            p.terminate()
        assert a.wait(timeout=60) == 0, log_a.read_text()[-3000:]
        assert b.wait(timeout=60) == 0, log_b.read_text()[-3000:]
    _assert_readers_exact(root, 2 * PER_RUN + 10)
