"""The Iceberg table on S3 (SeaweedFS on 127.0.0.1): `table_format = "iceberg"` with
`spark.output_dir = "s3://bucket/path"`: pyiceberg writes the data files through pyarrow's S3
filesystem and commits each version with a create-only put (If-None-Match), and pyiceberg, DuckDB
(httpfs) and Polars each count every landed record once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.delta import land, make_config
from support.iceberg_readers import every_s3_iceberg_reader_keys
from support.seaweedfs import fresh_uri
from support.seaweedfs import signing_gateway as signing_gateway  # the fixture
from support.table_readers import S3, offsets

from mqd.config import LandingS3Config, MqdConfig
from mqd.spark import job
from mqd.spark.iceberg_catalog import is_iceberg_table
from mqd.testing.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS

pytestmark = pytest.mark.spark


def test_an_iceberg_table_on_s3_is_exact_for_every_reader(
    tmp_path: Path, spark: Any, seaweedfs: SeaweedFS, signing_gateway: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Landed records -> `--once` -> an Iceberg table under s3:// (the landing's endpoint, keys from
    the AWS variables): every reader counts each record once, again after a second run appends; a
    new checkpoint for the table is refused (the guard reads the table's tokens from S3)."""
    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)):
        monkeypatch.setenv(name, value)
    uri = f"{fresh_uri(seaweedfs)}/warehouse/events"
    base = make_config(tmp_path, output_dir=uri, table_format="iceberg")
    landing = base.landing.model_copy(
        update={"s3": LandingS3Config(endpoint_url=signing_gateway, region=REGION)}
    )
    cfg = MqdConfig(landing=landing, spark=base.spark)
    s3 = S3(signing_gateway, ACCESS_KEY, SECRET_KEY, REGION)

    expected = land(Path(cfg.landing.dir), partitions=2, files=2, records=50)
    assert job.run(cfg, once=True) == 0
    assert is_iceberg_table(uri, job.iceberg_file_io(cfg))
    for reader, keys in every_s3_iceberg_reader_keys(uri, s3).items():
        assert offsets(keys) == expected, reader

    expected = sorted(expected + land(Path(cfg.landing.dir), partitions=1, files=1, records=50, first_file=2))
    assert job.run(cfg, once=True) == 0
    for reader, keys in every_s3_iceberg_reader_keys(uri, s3).items():
        assert offsets(keys) == expected, reader

    fresh = cfg.model_copy(
        update={"spark": cfg.spark.model_copy(update={"checkpoint_dir": tmp_path / "new-checkpoint"})}
    )
    assert job.run(fresh, once=True) == 2
