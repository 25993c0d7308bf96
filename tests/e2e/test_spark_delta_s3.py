"""The Delta table on S3 (SeaweedFS on 127.0.0.1): `spark.output_dir = "s3://bucket/path"` is
written through S3A (hadoop-aws matched to pyspark's Hadoop, from mqd's package cache) with the
endpoint of `[landing.s3]`, and read exactly by Spark, delta-rs, Polars and DuckDB (httpfs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.delta import land, make_config
from support.seaweedfs import fresh_uri
from support.seaweedfs import signing_gateway as signing_gateway  # the fixture
from support.table_readers import S3, every_reader_keys, offsets

from mqd.config import LandingS3Config, MqdConfig
from mqd.spark import job
from mqd.spark.session import s3a_options
from mqd.testing.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

pytestmark = pytest.mark.spark


@pytest.fixture
def s3_credentials(spark: Any) -> Iterator[None]:
    """The store's keys in Hadoop's configuration: the JVM may have started before the AWS variables
    were set (S3A's variable provider reads the JVM's environment), so tests give S3A the keys."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("fs.s3a.access.key", ACCESS_KEY)
    hadoop.set("fs.s3a.secret.key", SECRET_KEY)
    try:
        yield
    finally:
        hadoop.unset("fs.s3a.access.key")
        hadoop.unset("fs.s3a.secret.key")


def s3_config(tmp_path: Path, endpoint: str, table_uri: str) -> MqdConfig:
    cfg = make_config(tmp_path, output_dir=table_uri)
    s3 = LandingS3Config(endpoint_url=endpoint, region=REGION)
    landing = cfg.landing.model_copy(update={"s3": s3})
    return MqdConfig(landing=landing, spark=cfg.spark)


def test_an_s3_table_is_exact_for_every_reader(
    tmp_path: Path, spark: Any, seaweedfs: SeaweedFS, signing_gateway: str, s3_credentials: None
) -> None:
    """Landed records -> `--once` -> a Delta table under s3:// (S3A, the landing's endpoint,
    path-style): Spark, delta-rs, Polars and DuckDB count each record once; a second run adds only
    the new ones."""
    uri = f"{fresh_uri(seaweedfs)}/warehouse/events"
    cfg = s3_config(tmp_path, signing_gateway, uri)
    assert s3a_options(cfg)["spark.hadoop.fs.s3a.endpoint"] == signing_gateway
    assert s3a_options(cfg)["spark.hadoop.fs.s3a.path.style.access"] == "true"
    expected = land(Path(cfg.landing.dir), partitions=2, files=2, records=50)
    assert job.run(cfg, once=True) == 0
    s3 = S3(signing_gateway, ACCESS_KEY, SECRET_KEY, REGION)
    keys = seaweedfs.client().list_objects_v2(Bucket=seaweedfs.bucket, Prefix=uri[5:].split("/", 1)[1])
    assert any("/_delta_log/" in o["Key"] for o in keys.get("Contents", []))

    def exact(expected: list[tuple[str, int, int]]) -> None:
        table = spark.read.format("delta").load("s3a://" + uri.removeprefix("s3://"))
        rows = table.select("topic", "partition", "offset").collect()
        assert sorted((r.topic, r.partition, r.offset) for r in rows) == expected
        for reader, found in every_reader_keys(uri, s3).items():
            assert offsets(found) == expected, reader

    exact(expected)
    expected = sorted(expected + land(Path(cfg.landing.dir), partitions=1, files=1, records=50, first_file=2))
    assert job.run(cfg, once=True) == 0
    exact(expected)


def test_a_table_scheme_the_job_cannot_write_is_refused(tmp_path: Path) -> None:
    """`gs://`, `abfs://` or `s3a://` as spark.output_dir: the config names the key, not a path
    silently made of the URI under the config's folder."""
    from support.config import config_error, write_file

    for uri in ("gs://lake/events", "s3a://lake/events", "s3://lake"):
        path = write_file(tmp_path, f'[spark]\noutput_dir = "{uri}"\n')
        msg = config_error(path)
        assert "spark.output_dir" in msg, msg
