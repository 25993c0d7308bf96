"""The Spark job's tests on an ``s3://`` landing (SeaweedFS on 127.0.0.1): ``s3_spark``, a module's
Spark session whose Python workers get the store's AWS variables (a module-scoped fixture: a test
module imports it into its namespace), a job config landing from the store, and the table's
(partition, offset) keys with the check that each record is there exactly once. Used by
tests/e2e/test_spark_s3.py, test_spark_lifecycle.py and test_offsets_reset_s3.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mqd.config import LandingConfig, LandingS3Config, MqdConfig, SparkConfig
from mqd.spark import job
from mqd.testing.seaweedfs import SeaweedFS
from support.delta import read_delta


@pytest.fixture(scope="module")
def s3_spark(seaweedfs: SeaweedFS) -> Iterator[Any]:
    """A local[2] session whose Python workers (the data source's driver runner and its readers)
    get the store's AWS variables. Workers inherit the JVM's environment: when this module starts
    the JVM, os.environ is enough (as for ``mqd spark``); when an earlier module did, they come as
    ``spark.executorEnv.*`` (read by the next SparkContext from the JVM's system properties)."""
    from pyspark import SparkContext

    saved = {k: os.environ.get(k) for k in seaweedfs.env()}
    os.environ.update(seaweedfs.env())
    job.python_workers("local[2]")  # as job.run does before it starts a session
    jvm = SparkContext._jvm
    if jvm is not None:
        for k, v in seaweedfs.env().items():
            jvm.java.lang.System.setProperty(f"spark.executorEnv.{k}", v)
    session = job.build_session(MqdConfig(spark=SparkConfig(master="local[2]", shuffle_partitions=2)))
    try:
        yield session
    finally:
        session.stop()
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def s3_config(root: Path, uri: str, endpoint: str, **spark_kw: Any) -> MqdConfig:
    return MqdConfig(
        landing=LandingConfig(dir=uri, s3=LandingS3Config(endpoint_url=endpoint, region="us-east-1")),
        spark=SparkConfig(
            output_dir=root / "out",
            checkpoint_dir=root / "ckpt",
            quarantine_dir=root / "quarantine",
            shuffle_partitions=2,
            **spark_kw,
        ),
    )


def table_keys(spark: Any, out: Path | str) -> np.ndarray:
    """(partition, offset) of every row of the output table, read through its Delta log."""
    rows = read_delta(spark, out).select("partition", "offset").collect()
    return np.array([(r.partition, r.offset) for r in rows], dtype=np.int64).reshape(-1, 2)


def assert_once(keys: np.ndarray, partitions: int, per_partition: int) -> None:
    uniq = np.unique(keys, axis=0)
    assert len(keys) == len(uniq), f"{len(keys) - len(uniq)} duplicate rows in the table"
    want = np.array([(p, o) for p in range(partitions) for o in range(per_partition)])
    assert len(uniq) == len(want) and (uniq == want).all(), "rows lost"
