"""The session settings a micro-batch and the maintenance depend on (decisions 063, 066 and 068),
without Spark."""

from __future__ import annotations

import pytest

from mqd.config import MqdConfig, SparkConfig
from mqd.spark.session import batch_options

SNAPSHOT = "spark.databricks.delta.snapshotPartitions"
LISTING = "spark.sql.sources.parallelPartitionDiscovery.threshold"


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]"])
def test_a_local_master_rebuilds_delta_snapshots_in_one_task(master: str) -> None:
    """The replay of Delta's snapshot rebuild cost 0.68 CPU-s in 4 tasks and 0.07 in one on 2
    cores: one task, whatever the job's shuffle width (decision 066)."""
    cfg = MqdConfig(spark=SparkConfig(master=master, shuffle_partitions=4))
    assert batch_options(cfg)[SNAPSHOT] == "1"


def test_a_cluster_rebuilds_them_with_the_shuffle_width() -> None:
    cfg = MqdConfig(spark=SparkConfig(master="spark://10.0.0.1:7077", shuffle_partitions=64))
    assert batch_options(cfg)[SNAPSHOT] == "64"


def test_the_master_given_to_the_session_decides() -> None:
    """``mqd spark --master`` overrides the configured one: the settings follow the session's."""
    cfg = MqdConfig(spark=SparkConfig(master="local[2]", shuffle_partitions=8))
    assert batch_options(cfg, "spark://10.0.0.1:7077")[SNAPSHOT] == "8"
    cluster = MqdConfig(spark=SparkConfig(master="spark://10.0.0.1:7077", shuffle_partitions=8))
    assert batch_options(cluster, "local[2]")[SNAPSHOT] == "1"


def test_a_batch_files_are_listed_in_the_driver() -> None:
    cfg = MqdConfig(spark=SparkConfig(max_files_per_trigger=500))
    assert batch_options(cfg)[LISTING] == "500"
    assert batch_options(MqdConfig(spark=SparkConfig(max_files_per_trigger=10)))[LISTING] == "32"


@pytest.mark.parametrize("master", ["local[2]", "spark://10.0.0.1:7077"])
def test_listing_jobs_run_at_the_shuffle_width(master: str) -> None:
    """Delta's VACUUM walks a table's folders in ``parallelPartitionDiscovery.parallelism`` tasks
    (Spark's default 10,000: a minute for a three-file table on 2 cores): the job's width on any
    master (decision 068)."""
    cfg = MqdConfig(spark=SparkConfig(master=master, shuffle_partitions=6))
    assert batch_options(cfg)["spark.sql.sources.parallelPartitionDiscovery.parallelism"] == "6"
