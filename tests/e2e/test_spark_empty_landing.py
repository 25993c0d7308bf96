"""A streaming job started on a landing that holds no file yet: it idles until files land, then puts
them in the table (bench/README.md found its first batch failing with
PLAN_VALIDATION_FAILED_RULE_IN_BATCH, CollapseProject, exit 1)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from support.delta import assert_exact, land, make_config
from support.spark_job import start_streaming, stop_streaming

from mqd.config import MqdConfig, SparkConfig
from mqd.landing import LocalStore
from mqd.spark import job
from mqd.spark.table_format import existing_format

pytestmark = pytest.mark.spark


def _rows(spark: Any, path: Path) -> int:
    if existing_format(path) != "delta":
        return 0
    return int(spark.read.format("delta").load(str(path)).count())


def _idle_triggers(spark: Any, name: str, worker: Any) -> None:
    """Wait (bounded) until the running query has fired triggers on the empty landing."""
    deadline = time.monotonic() + 120
    while True:
        assert worker.is_alive(), "the job ended on an empty landing"
        active = [q for q in spark.streams.active if q.name == name]
        if active and len(active[0].recentProgress) >= 2:
            return
        assert time.monotonic() < deadline, "the query never fired a trigger"
        time.sleep(0.2)


def test_a_job_started_on_an_empty_landing_writes_the_files_landed_later(tmp_path: Path, spark: Any) -> None:
    cfg = make_config(tmp_path, trigger_interval="1 second")
    LocalStore(tmp_path / "landing").open()  # the daemon made the landing; nothing landed yet
    worker, result = start_streaming(cfg)
    try:
        _idle_triggers(spark, "mqd-events", worker)
        expected = land(tmp_path / "landing", partitions=2, files=2, records=5)
        deadline = time.monotonic() + 120
        while _rows(spark, tmp_path / "events") < len(expected):
            assert worker.is_alive(), f"the job ended: {result}"
            assert time.monotonic() < deadline, "the landed files never reached the table"
            time.sleep(0.5)
    finally:
        stop_streaming(spark, worker, timeout=60)
    assert result == {"code": 0}
    assert_exact(spark, tmp_path / "events", expected)


def test_the_session_keeps_a_batch_to_its_write(spark: Any) -> None:
    """Decisions 063 and 066: a batch's files listed in the driver (no job of a task per file),
    Delta's snapshot rebuilt in one task on a local master (not 50 after every commit, nor the
    shuffle width: each replay task costs the same fixed CPU). The job's session is the shared
    one, given this config's settings (as job.run does)."""
    cfg = MqdConfig(spark=SparkConfig(master="local[2]", shuffle_partitions=2, max_files_per_trigger=500))
    session = job.build_session(cfg)
    assert session.conf.get("spark.databricks.delta.snapshotPartitions") == "1"
    assert session.conf.get("spark.sql.sources.parallelPartitionDiscovery.threshold") == "500"
