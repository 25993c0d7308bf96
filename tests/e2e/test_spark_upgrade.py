"""The Spark job's table schema change on upgrade (issue 12, "Upgrades are safe"): a checkpoint and
output table written by the previous job keep working; the new columns read as null for the rows
the previous job wrote. Real landing files and a real local Spark session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from mqd import format as fmt
from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher
from mqd.spark import job

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# the source schema of the job before this change (timestamp read as TIMESTAMP, no new columns)
PREVIOUS_DDL = (
    "topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, dt STRING, hour INT"
)


def make_config(root: Path) -> MqdConfig:
    return MqdConfig(
        landing=LandingConfig(dir=root / "landing"),
        spark=SparkConfig(
            output_dir=root / "out",
            checkpoint_dir=root / "ckpt",
            quarantine_dir=root / "quarantine",
            shuffle_partitions=2,
        ),
    )


def publish(pub: Publisher, first: int, count: int, ts: int) -> None:
    raw = fmt.encode_batch(
        [b"v%d" % (first + i) for i in range(count)], timestamps=np.full(count, ts), base_offset=first
    )
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    pub.publish("events", 0, pa.Table.from_batches([rb]), pub.store.head("events", 0).last_offset)


def run_previous_job(spark: Any, cfg: MqdConfig) -> None:
    """The raw-mode query as the previous job built it, on the same output and checkpoint."""
    from pyspark.sql import functions as F

    df = (
        spark.readStream.schema(PREVIOUS_DDL)
        .option("pathGlobFilter", "*.parquet")
        .parquet(str(cfg.landing.dir))
    )
    query = (
        df.where(F.col("partition").isNotNull() & F.col("offset").isNotNull())
        .writeStream.format("parquet")
        .option("path", str(cfg.spark.output_dir))
        .option("checkpointLocation", str(cfg.spark.checkpoint_dir / "main"))
        .outputMode("append")
        .partitionBy("topic", "dt")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None and not query.isActive


def test_previous_checkpoint_and_table_keep_working(tmp_path: Path, spark: Any) -> None:
    """Rows the previous job wrote stay once; the new job, on the same checkpoint, appends only
    the files published since, and the table read with mergeSchema has the new column, null for
    the old rows."""
    cfg = make_config(tmp_path)
    pub = Publisher(LocalStore(cfg.landing.dir))
    pub.store.open()
    publish(pub, 0, 30, T0)
    run_previous_job(spark, cfg)
    publish(pub, 30, 20, T0 + 3_600_000)

    assert job.run(cfg, once=True) == 0
    out = spark.read.option("mergeSchema", "true").parquet(str(cfg.spark.output_dir))
    assert job.RAW_TIMESTAMP_COLUMN in out.columns
    rows = out.select("offset", "timestamp", job.RAW_TIMESTAMP_COLUMN).collect()
    assert sorted(r.offset for r in rows) == list(range(50))
    assert all(r[job.RAW_TIMESTAMP_COLUMN] is None and r.timestamp is not None for r in rows)
