"""The Spark job never drops data silently (issue 12, case 8): out-of-range timestamps are read,
clamped with the raw value kept; an unreadable file fails the job instead of being skipped.

Real landing files, a real local Spark session (one per module, as in test_spark.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.delta import read_delta
from support.landing import read_manifest

from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher
from mqd.spark import job
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LAST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the landing's last instant


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


def publish(pub: Publisher, partition: int, first: int, ts: list[int]) -> None:
    raw = fmt.encode_batch(
        [b"v%d" % (first + i) for i in range(len(ts))], timestamps=np.array(ts), base_offset=first
    )
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    pub.publish(
        "events", partition, pa.Table.from_batches([rb]), pub.store.head("events", partition).last_offset
    )


def test_nanosecond_timestamps_are_clamped_and_kept_raw(tmp_path: Path, spark: Any) -> None:
    """A producer stamping nanoseconds into the millisecond field: its records (and the normal
    record sharing their file) all reach the table; ``timestamp`` is clamped to the landing's last
    instant (the folder they are filed under) and ``timestamp_raw_ms`` keeps the producer's value;
    in-range records have it null. A value before 1970 is clamped to 1970 the same way."""
    cfg = make_config(tmp_path)
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    publish(pub, 0, 0, [T0, T0 + 1])
    ns = [time.time_ns(), time.time_ns() + 1]
    last_ms = LAST_MS - 500  # 9999-12-31T23:59:59.499Z: same folder hour, in range
    publish(pub, 0, 2, [last_ms, *ns])
    publish(pub, 1, 0, [-(2**62)])  # far before 1970 (and year 1)
    assert len(read_manifest(Path(cfg.landing.dir))) == 3

    assert job.run(cfg, once=True) == 0
    rows = {
        (r.partition, r.offset): (r.timestamp_ms, r.timestamp_raw_ms)
        for r in read_delta(spark, cfg.spark.output_dir)
        .selectExpr("partition", "offset", "unix_millis(timestamp) AS timestamp_ms", "timestamp_raw_ms")
        .collect()
    }
    assert rows == {
        (0, 0): (T0, None),
        (0, 1): (T0 + 1, None),
        (0, 2): (last_ms, None),
        (0, 3): (LAST_MS, ns[0]),
        (0, 4): (LAST_MS, ns[1]),
        (1, 0): (0, -(2**62)),
    }


def test_truncated_file_fails_the_job_until_restored(tmp_path: Path, spark: Any) -> None:
    """A landed file cut short (a disk or copy fault) is not skipped: the job exits 1 and names
    it; once the file is restored the same checkpoint lands every record exactly once."""
    cfg = make_config(tmp_path)
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    publish(pub, 0, 0, [T0 + i for i in range(20)])
    publish(pub, 0, 20, [T0 + 3_600_000 + i for i in range(20)])
    victim = Path(cfg.landing.dir) / read_manifest(Path(cfg.landing.dir))[1].path
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])

    assert job.run(cfg, once=True) == 1
    victim.write_bytes(whole)
    assert job.run(cfg, once=True) == 0
    out = read_delta(spark, cfg.spark.output_dir)
    assert sorted(r.offset for r in out.select("offset").collect()) == list(range(40))


def test_unreadable_file_is_named_from_sparks_error() -> None:
    """The job's error line names the file from Spark's FAILED_READ_FILE message."""
    msg = (
        "[FAILED_READ_FILE.NO_HINT] Encountered error while reading file "
        "file:///l/topic=e/dt=2026-01-01/hour=00/part-00000-00000000000000000020.parquet.  SQLSTATE: KD001"
    )
    assert (
        job.unreadable_file(msg)
        == "file:///l/topic=e/dt=2026-01-01/hour=00/part-00000-00000000000000000020.parquet"
    )
    assert job.unreadable_file("some other failure") is None
