"""The Spark job's table schema change on upgrade (issue 12, "Upgrades are safe"): a checkpoint and
output table written by the previous job keep working; the new columns read as null for the rows
the previous job wrote. Real landing files and a real local Spark session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mqd import records
from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher, layout
from mqd.landing.local_migration import migrate
from mqd.spark import job
from mqd.wire import format as fmt

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
            table_format="parquet",  # the table an mqd before table formats wrote (Delta: test_spark_delta)
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
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
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


# the data file schema before log incarnations (format 1): no incarnation column
FORMAT1_SCHEMA = pa.schema(
    [("topic", pa.dictionary(pa.int32(), pa.string())), ("partition", pa.int32()), *records.RECORD_SCHEMA]
)
INCARNATION = "0123456789abcdef0123456789abcdef"


def write_format1_file(root: Path, first: int, count: int, ts: int) -> None:
    """A data file as a landing made before log incarnations held it (format-1 name and columns)."""
    raw = fmt.encode_batch(
        [b"v%d" % (first + i) for i in range(count)], timestamps=np.full(count, ts), base_offset=first
    )
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    topic = pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int32)), pa.array(["events"]))
    table = pa.Table.from_arrays(
        [topic, pa.array(np.zeros(count, dtype=np.int32)), *rb.columns], schema=FORMAT1_SCHEMA
    )
    path = root / layout.hour_dir("events", ts // layout.HOUR_MS) / f"part-00000-{first:020d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def test_incarnation_column_across_the_landing_upgrade(tmp_path: Path, spark: Any) -> None:
    """A format-1 landing read by the previous job; the landing migrated and new files landed
    under an incarnation; the new job on the same checkpoint appends only the new files: the
    table gains ``incarnation``, null for the records landed before, the id for the new ones."""
    cfg = make_config(tmp_path)
    write_format1_file(Path(cfg.landing.dir), 0, 30, T0)
    run_previous_job(spark, cfg)
    migrate(Path(cfg.landing.dir))
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    raw = fmt.encode_batch(
        [b"n%d" % i for i in range(20)], timestamps=np.full(20, T0 + 3_600_000), base_offset=30
    )
    pub.publish(
        "events",
        0,
        pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])]),
        None,
        incarnation=INCARNATION,
    )

    assert job.run(cfg, once=True) == 0
    out = spark.read.option("mergeSchema", "true").parquet(str(cfg.spark.output_dir))
    assert "incarnation" in out.columns
    rows = sorted((r.offset, r.incarnation) for r in out.select("offset", "incarnation").collect())
    assert rows == [(i, None) for i in range(30)] + [(i, INCARNATION) for i in range(30, 50)]
