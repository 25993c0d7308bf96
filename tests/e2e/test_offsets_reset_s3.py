"""`mqd offsets reset` on an ``s3://`` landing (SeaweedFS on 127.0.0.1), with the daemon and the CLI
as their own processes: the reset records are objects of the landing (``_resets/<t>/<p>.json``,
written through the store seam as on a local landing), a reset to earliest replays every landed
record once more under a replay id when the daemon next starts, the record is removed once the
landing moved past it, and ``mqd spark --once`` (through the s3 data source) counts each record
twice: once under the log's incarnation, once under the replay id."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.cli import mqd, write_config
from support.daemon import produce_numbered
from support.delta import read_delta
from support.seaweedfs import fresh_uri, s3_objects
from support.spark_s3 import s3_config
from support.spark_s3 import s3_spark as s3_spark  # the module's Spark session with the store's env

from mqd.landing.store import LandingStore
from mqd.process.reset_records import read_reset
from mqd.spark import job
from mqd.testing.seaweedfs import SeaweedFS
from mqd.topic_partition import TopicPartition
from mqd.wire.client import BrokerClient

pytestmark = pytest.mark.spark

PARTITIONS, PER_PARTITION, MORE = 2, 300, 50


def _burst(cfg: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """One `mqd run --burst`; its JSON log lines."""
    res = mqd("run", "--config", str(cfg), "--burst", timeout=180, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = []
    for line in (res.stdout + res.stderr).splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


async def test_reset_to_earliest_on_s3_replays_every_record_once_more(
    cluster_factory: Any, tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any
) -> None:
    """Land 600 records into s3://, read them with Spark; `offsets reset --to earliest` writes one
    record per partition into the bucket; the next daemon start replays all 600 under one replay id
    per partition (logged, counted) and lands 100 new records after them under the log's
    incarnation; the start after that clears the records; the table then holds every replayed
    (partition, offset) exactly twice, once per incarnation, and every new one once."""
    env = seaweedfs.env()
    uri = fresh_uri(seaweedfs)
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    cfg = write_config(
        tmp_path,
        cluster,
        consumer={"group": "s3-resets"},
        landing={"dir": uri, "max_age": 0.3, "s3.endpoint_url": seaweedfs.endpoint, "s3.region": "us-east-1"},
    )
    spark_cfg = s3_config(tmp_path / "spark", uri, seaweedfs.endpoint)
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=100)
    await asyncio.to_thread(_burst, cfg, env)
    assert await asyncio.to_thread(job.run, spark_cfg, once=True) == 0

    res = await asyncio.to_thread(
        mqd, "offsets", "reset", "--config", str(cfg), "events", "--to", "earliest", env=env
    )
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"replays {PER_PARTITION} offsets (0..{PER_PARTITION - 1})" in res.stdout
    objects = s3_objects(seaweedfs, uri)
    recs = {p: read_reset(objects, TopicPartition("events", p)) for p in range(PARTITIONS)}
    assert all(r is not None and r.replay_id and r.to_offset == 0 for r in recs.values()), recs
    shown = await asyncio.to_thread(mqd, "offsets", "show", "--config", str(cfg), env=env)
    assert shown.returncode == 0, shown.stderr
    row0 = next(line.split() for line in shown.stdout.splitlines() if line.startswith("events:0 "))
    assert row0[1] == str(PER_PARTITION) and row0[-1] == "0"  # LANDED, PENDING

    async with BrokerClient(request_timeout=20) as client:  # new records land after the replay
        await produce_numbered(client, cluster, PARTITIONS, MORE, start=PER_PARTITION, per_batch=50)
    logs = await asyncio.to_thread(_burst, cfg, env)
    applied = {str(a["tp"]): a for a in logs if a.get("event") == "offsets reset applied"}
    assert {k: v["replayed_offsets"] for k, v in applied.items()} == {
        f"events/{p}": PER_PARTITION for p in range(PARTITIONS)
    }
    manifest = LandingStore(objects).manifest("events")
    for p in range(PARTITIONS):
        rec = recs[p]
        assert rec is not None
        replayed = [r for r in manifest if r.partition == p and r.incarnation == rec.replay_id]
        assert sum(r.count for r in replayed) == PER_PARTITION
    await asyncio.to_thread(_burst, cfg, env)  # the landing moved past the records: cleared now
    assert all(read_reset(objects, TopicPartition("events", p)) is None for p in range(PARTITIONS))

    assert await asyncio.to_thread(job.run, spark_cfg, once=True) == 0
    rows = (
        read_delta(s3_spark, spark_cfg.spark.output_dir)
        .select("partition", "offset", "incarnation")
        .collect()
    )
    per_key = Counter((r.partition, r.offset) for r in rows)
    want = {
        (p, o): 2 if o < PER_PARTITION else 1 for p in range(PARTITIONS) for o in range(PER_PARTITION + MORE)
    }
    assert per_key == want, "each replayed record exactly twice, each new one once"
    for p in range(PARTITIONS):
        rec = recs[p]
        assert rec is not None
        assert sum(1 for r in rows if r.partition == p and r.incarnation == rec.replay_id) == PER_PARTITION
