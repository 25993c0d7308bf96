"""landing.table = "delta": the daemon commits what it publishes to a Delta table at the landing's
root, and the table read by delta-rs, DuckDB and Polars holds every record exactly once, on a local
disk and on SeaweedFS (S3)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.cli import mqd, write_config
from support.daemon import daemon_config, produce_numbered
from support.seaweedfs import fresh_uri
from support.table_readers import S3, every_reader_keys, offsets

from mqd.config import LandingDeltaConfig, LandingS3Config
from mqd.landing import delta_log
from mqd.landing.local_objects import LocalObjects
from mqd.process.daemon import Daemon
from mqd.testing.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS
from mqd.wire.client import BrokerClient

PARTITIONS = 4
PER_PARTITION = 5_000


def expected(partitions: int, per_partition: int, start: int = 0) -> list[tuple[str, int, int]]:
    return sorted(("events", p, o) for p in range(partitions) for o in range(start, per_partition))


def table_config(cfg: Any, **landing: Any) -> Any:
    delta = LandingDeltaConfig(commit_interval=0.5, checkpoint_interval=5)
    return cfg.model_copy(
        update={"landing": cfg.landing.model_copy(update={"table": "delta", "delta": delta, **landing})}
    )


async def test_burst_lands_every_record_once_in_the_local_landing_table(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """A burst run with landing.table = "delta" on a local landing: when `run` returns, delta-rs,
    DuckDB and Polars each read exactly the 20,000 produced records from the table, none twice;
    one txn per partition at its last offset; a second burst with 100 more records per partition
    commits only those (every reader then reads 20,400); `mqd landing query` with DuckDB and with
    Polars says the same per partition."""
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=500)
        cfg = table_config(daemon_config(cluster, tmp_path, max_records=1_000))
        d = Daemon(cfg, burst=True)
        await asyncio.wait_for(d.run(), 120)
        assert d.stats["records_published"] == PARTITIONS * PER_PARTITION
        root = tmp_path / "landing"
        for reader, keys in every_reader_keys(root).items():
            assert offsets(keys) == expected(PARTITIONS, PER_PARTITION), reader
        table = delta_log.LandingTable(str(root), LocalObjects(root))
        assert table.load(create=False)
        incs = {f.partition: f.incarnation for f in d.sink.store.manifest("events")}
        for p in range(PARTITIONS):
            assert table.txn_version(delta_log.app_id("events", p, incs[p])) == PER_PARTITION - 1
        status = d.status()["landing"]["table"]
        assert status["files"] == d.stats["files_published"] and status["dropped_stale"] == 0

        await produce_numbered(client, cluster, PARTITIONS, 100, start=PER_PARTITION, per_batch=100)
        d2 = Daemon(cfg, burst=True)
        await asyncio.wait_for(d2.run(), 120)
        for reader, keys in every_reader_keys(root).items():
            assert offsets(keys) == expected(PARTITIONS, PER_PARTITION + 100), reader
        assert d2.status()["landing"]["table"]["files"] == d2.stats["files_published"]

    # `mqd landing query`, both engines, on the same table
    toml = write_config(tmp_path, cluster, landing={"dir": str(root), "table": "delta"})
    for engine in ("duckdb", "polars"):
        res = mqd("landing", "query", "-c", str(toml), "--engine", engine, "--json")
        assert res.returncode == 0, res.stderr
        rows = [json.loads(line) for line in res.stdout.splitlines()]
        got = [(r["partition"], r["records"], r["first_offset"], r["last_offset"]) for r in rows]
        assert got == [(p, PER_PARTITION + 100, 0, PER_PARTITION + 99) for p in range(PARTITIONS)], engine
        res = mqd(
            "landing", "query", "-c", str(toml), "--engine", engine, "SELECT count(*) AS n FROM landing"
        )
        assert res.returncode == 0 and str(PARTITIONS * (PER_PARTITION + 100)) in res.stdout, res.stdout


@pytest.mark.slow
async def test_burst_lands_every_record_once_in_the_s3_landing_table(
    cluster_factory: Any, tmp_path: Path, seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on SeaweedFS (landing.dir = "s3://..."): delta-rs, DuckDB and Polars read exactly
    the 20,000 records from the table at the landing's root, none twice; so does `mqd landing
    query` with either engine."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    uri = fresh_uri(seaweedfs)
    s3 = LandingS3Config(endpoint_url=seaweedfs.endpoint, region=REGION)
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=500)
        cfg = table_config(daemon_config(cluster, tmp_path, max_records=1_000), dir=uri, s3=s3)
        d = Daemon(cfg, burst=True)
        await asyncio.wait_for(d.run(), 180)
        assert d.stats["records_published"] == PARTITIONS * PER_PARTITION
        assert d.status()["landing"]["table"]["files"] == d.stats["files_published"]
    readers = S3(seaweedfs.endpoint, ACCESS_KEY, SECRET_KEY, REGION)
    for reader, keys in every_reader_keys(uri, readers).items():
        assert offsets(keys) == expected(PARTITIONS, PER_PARTITION), reader
    toml = write_config(tmp_path, cluster, landing={"dir": uri, "table": "delta"})
    for engine in ("duckdb", "polars"):
        res = mqd(
            "landing",
            "query",
            "-c",
            str(toml),
            "--engine",
            engine,
            "--json",
            "SELECT count(*) AS n FROM landing",
            env={"MQD_LANDING__S3__ENDPOINT_URL": seaweedfs.endpoint},
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"n": PARTITIONS * PER_PARTITION}, engine
