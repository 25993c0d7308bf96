"""End to end: brokers -> daemon -> landing -> `mqd spark --once` -> table, exactly once, also
through SIGKILLs of the daemon process."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.daemon import FAST_CONSUMER, assert_exactly_once, daemon_config, produce_numbered
from support.delta import read_delta
from support.harness import Cluster, to_toml
from support.landing import read_manifest

from mqd.config import MqdConfig, SparkConfig, load_daemon_config
from mqd.process.daemon import Daemon
from mqd.spark import job
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient, BrokerError

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 8
PER_PARTITION = 12_500  # 100,000 records


def spark_config(cfg: MqdConfig, root: Path) -> MqdConfig:
    return cfg.model_copy(
        update={
            "spark": SparkConfig(
                output_dir=root / "table",
                checkpoint_dir=root / "ckpt",
                quarantine_dir=root / "quarantine",
                shuffle_partitions=2,
                max_files_per_trigger=50,
            )
        }
    )


def assert_table_exactly_once(spark: Any, cfg: MqdConfig, total: int) -> None:
    table = read_delta(spark, cfg.spark.output_dir)
    assert table.count() == total
    assert table.select("topic", "partition", "offset").distinct().count() == total


async def test_100k_records_burst_then_spark(cluster_factory: Any, tmp_path: Path, spark: Any) -> None:
    """100,000 records over 8 partitions -> daemon (burst) -> spark job --once: the table holds
    100,000 rows and 100,000 distinct (topic, partition, offset)."""
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=2)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=2500)
    cfg = spark_config(daemon_config(cluster, tmp_path, max_records=20_000), tmp_path)
    d = Daemon(cfg, burst=True)
    await asyncio.wait_for(d.run(), 120)
    assert d.stats["records_published"] == 100_000
    assert_exactly_once(Path(cfg.landing.dir), PARTITIONS, PER_PARTITION)
    assert job.run(cfg, once=True) == 0
    assert_table_exactly_once(spark, cfg, 100_000)


def write_daemon_toml(cluster: Cluster, root: Path) -> Path:
    data = {
        "consumer": {
            **FAST_CONSUMER,
            "group": "landing",
            "bootstrap": [cluster.bootstrap],
            "topics": ["events"],
            "max_queued_records": 2000,
        },
        "landing": {"dir": str(root / "landing"), "max_records": 1500, "max_age": 0.5},
        "spark": {
            "output_dir": str(root / "table"),
            "checkpoint_dir": str(root / "ckpt"),
            "quarantine_dir": str(root / "quarantine"),
            "shuffle_partitions": 2,
            "max_files_per_trigger": 200,
        },
        "admin": {"enabled": False},
        "log": {"format": "json", "level": "info"},
        "daemon": {
            "state_dir": str(root / "state"),
            "pid_file": str(root / "state/mqd.pid"),
            "log_file": str(root / "state/mqd.log"),
            "shutdown_timeout": 10.0,
        },
    }
    path = root / "mqd.toml"
    path.write_text(to_toml(data))
    return path


async def wait_for_empty_group(client: BrokerClient, cluster: Cluster, group: str, timeout: float) -> None:
    """Poll the coordinator (leave of a non-member answers the member list) until no one is left."""

    async def empty() -> bool:
        for g in range(len(cluster.group_names)):
            try:
                members = (await client.leave(cluster.url(cluster.master(g)), group, "probe"))["members"]
            except BrokerError:
                continue
            return bool(members == [])
        return False

    await wait_until(empty, timeout, f"group {group} to have no members", interval=0.1)


def landed_count(landing: Path) -> int:
    return sum(r.count for r in read_manifest(landing)) if landing.is_dir() else 0


def start_daemon(config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # the child inherits the descriptor; ours is closed below
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(config), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    finally:
        out.close()


async def test_sigkill_at_random_points_keeps_exactly_once(
    cluster_factory: Any, tmp_path: Path, spark: Any
) -> None:
    """The daemon process is SIGKILLed at random points five times while records keep coming, and
    restarted each time; a final burst run lands the rest. Landing files and the Spark table hold
    each of the 100,000 records exactly once."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"seed={seed}")
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=2)
    config = write_daemon_toml(cluster, tmp_path)
    log = tmp_path / "daemon.log"
    per_round = PER_PARTITION // 5
    landing = tmp_path / "landing"
    landed_at_kill: list[int] = []
    async with BrokerClient(request_timeout=10) as client:
        for r in range(5):
            before = landed_count(landing)
            proc = start_daemon(config, log)
            try:
                # records arrive while the daemon runs; once it has published something this round
                # the kill lands at a random moment (mid-publication, mid-fetch, mid-commit)
                await produce_numbered(
                    client, cluster, PARTITIONS, per_round, start=r * per_round, per_batch=250
                )
                await wait_until(lambda b=before: landed_count(landing) > b, 60, "a publication")  # type: ignore[misc]
                await asyncio.sleep(rng.uniform(0.0, 0.6))
                assert proc.poll() is None, log.read_text()[-3000:]
            finally:
                proc.kill()
                proc.wait(timeout=30)
            landed_at_kill.append(landed_count(landing))
        # burst lands what it owns: let the killed members' sessions expire so it owns everything
        await wait_for_empty_group(client, cluster, "landing", 30)
    print(f"landed at each kill: {landed_at_kill}")
    assert any(n < (r + 1) * per_round * PARTITIONS for r, n in enumerate(landed_at_kill)), (
        "every kill came after the daemon had caught up: nothing was interrupted"
    )
    final = start_daemon(config, log, "--burst")
    try:
        code = await asyncio.to_thread(final.wait, 180)
    finally:
        if final.poll() is None:
            final.kill()
            final.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    cfg = load_daemon_config(config)
    assert_exactly_once(Path(cfg.landing.dir), PARTITIONS, PER_PARTITION)
    assert job.run(cfg, once=True) == 0
    assert_table_exactly_once(spark, cfg, 100_000)
