"""Helpers of the Delta table tests: land numbered records (or given values), a job config, and the
check that Spark and every other reader see each record once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher
from mqd.spark.table_format import spark_location
from mqd.wire import format as fmt
from support.table_readers import Key, every_reader_keys, offsets

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


Offsets = list[tuple[str, int, int]]


def land(root: Path, partitions: int, files: int, records: int, *, first_file: int = 0) -> Offsets:
    """``files`` files of ``records`` records into each partition of topic ``events``; their
    (topic, partition, offset), sorted."""
    pub = Publisher(LocalStore(root))
    pub.store.open()
    keys: Offsets = []
    for p in range(partitions):
        for f in range(first_file, first_file + files):
            values = [b"v%d" % i for i in range(records)]
            ts = np.full(records, T0 + f * 3_600_000, dtype=np.int64)
            raw = fmt.encode_batch(values, timestamps=ts, base_offset=f * records)
            batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
            pub.publish("events", p, pa.Table.from_batches([batch]), pub.store.head("events", p).last_offset)
            keys += [("events", p, f * records + i) for i in range(records)]
    return sorted(keys)


def land_values(root: Path, values: list[bytes]) -> list[tuple[str, int, int]]:
    """``values`` into partition 0 of topic ``events``, all with the Kafka timestamp T0 (so the
    landing's own dt is one day for all of them); their keys."""
    pub = Publisher(LocalStore(root))
    pub.store.open()
    raw = fmt.encode_batch(values, timestamps=np.full(len(values), T0, dtype=np.int64), base_offset=0)
    pub.publish("events", 0, pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])]), None)
    return [("events", 0, i) for i in range(len(values))]


def make_config(root: Path, **spark_kw: Any) -> MqdConfig:
    """A job landing from ``root/landing`` into ``root/events``; ``spark_kw`` overrides any key."""
    spark = {
        "output_dir": root / "events",
        "checkpoint_dir": root / "ckpt",
        "quarantine_dir": root / "quarantine",
        "shuffle_partitions": 2,
        "max_files_per_trigger": 4,
        **spark_kw,
    }
    return MqdConfig(landing=LandingConfig(dir=root / "landing"), spark=SparkConfig(**spark))


def read_delta(spark: Any, path: Path | str) -> Any:
    """The Delta table at ``path`` (a folder or an ``s3://`` URI) as Spark's Delta reader sees it:
    through its log. A folder read (``spark.read.parquet``) also lists the files of a batch that
    failed, which the log never named: a job that exited 1 leaves them (CI, 2026-12-02)."""
    return spark.read.format("delta").load(spark_location(path))


def spark_keys(spark: Any, path: Path) -> list[Key]:
    rows = read_delta(spark, path).select("topic", "partition", "incarnation", "offset")
    return sorted((r.topic, r.partition, r.incarnation, r.offset) for r in rows.collect())


def assert_exact(spark: Any, path: Path, expected: Offsets) -> None:
    """Spark and every other reader see each expected record once, under one incarnation."""
    for reader, keys in {"spark": spark_keys(spark, path), **every_reader_keys(path)}.items():
        assert offsets(keys) == expected, reader
        assert len(set(keys)) == len(keys), reader
