"""The Spark job on an ``s3://`` landing (SeaweedFS) whose claim chain is broken (issue 31 item 2):
``mqd spark --once`` (the job's ``run``, in-process, over mqd.spark.landing_source and the chain
reader) exits 1 naming the claim when a claim was deleted (a later one exists), overwritten by an
older valid claim, or overwritten by junk, and reads nothing past it; once the claim is restored,
the next run lands every record exactly once. The old reader exited 0 with a deleted claim's 160
records missing, or an older claim's file read twice (160 duplicated, 160 missing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog.testing
from support.chain_tamper import HOW, publish_files, tamper
from support.seaweedfs import object_store
from support.spark_s3 import s3_spark as s3_spark  # the module's Spark session with the store's env

from mqd.config import LandingConfig, LandingS3Config, MqdConfig, SparkConfig
from mqd.landing import Publisher
from mqd.spark import job
from mqd.testing.seaweedfs import SeaweedFS

pytestmark = pytest.mark.spark

PER_FILE = 160


def table_offsets(spark: Any, out: Path) -> np.ndarray:
    """The offsets of the table's rows (partition 0 only is landed here), sorted."""
    rows = spark.read.format("delta").load(str(out)).select("offset").collect()
    return np.sort(np.array([r.offset for r in rows], dtype=np.int64))


@pytest.mark.parametrize("how", HOW)
def test_spark_refuses_a_broken_chain_naming_the_claim(
    tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any, how: str
) -> None:
    """Two files read, then claim 2 of 5 broken: the run exits 1 naming the claim and the table
    keeps the two files' records only; with the claim restored the next run adds the other three
    files, every record once."""
    store = object_store(seaweedfs)
    cfg = MqdConfig(
        landing=LandingConfig(
            dir=store.location, s3=LandingS3Config(endpoint_url=seaweedfs.endpoint, region="us-east-1")
        ),
        spark=SparkConfig(
            output_dir=tmp_path / "out",
            checkpoint_dir=tmp_path / "ckpt",
            quarantine_dir=tmp_path / "quarantine",
            shuffle_partitions=2,
        ),
    )
    pub = Publisher(store)
    publish_files(pub, "events", 0, 2, PER_FILE)
    assert job.run(cfg, once=True) == 0
    publish_files(pub, "events", 0, 3, PER_FILE, start_file=2)
    saved = store.objects.get(f"_log/events/00000/claims/{2:020d}.json")
    assert saved is not None
    key = tamper(store.objects, "events", 0, 2, how)

    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 1
    failures = [e for e in logs if e.get("log_level") == "error"]
    assert any(key in str(e.get("error", "")) for e in failures), failures
    assert (table_offsets(s3_spark, Path(cfg.spark.output_dir)) == np.arange(2 * PER_FILE)).all()

    store.objects.put(key, saved[0])  # the operator's repair: the claim as it was
    assert job.run(cfg, once=True) == 0
    assert (table_offsets(s3_spark, Path(cfg.spark.output_dir)) == np.arange(5 * PER_FILE)).all()
