"""The Spark packages' names and mqd's cache folder: pure rules, no JVM."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqd.cache import cache_dir
from mqd.spark import packages
from mqd.spark.packages import PackagesError, SparkBuild


def test_hadoop_version_is_read_from_the_client_api_jar() -> None:
    """hadoop-aws is matched to the Hadoop client jar pyspark ships, not to any other hadoop jar."""
    names = [
        "hadoop-client-runtime-3.4.2.jar",
        "hadoop-client-api-3.5.0.jar",
        "hadoop-shaded-guava-1.4.0.jar",
    ]
    assert packages.hadoop_version(names) == "3.5.0"


def test_no_hadoop_client_is_a_clear_error() -> None:
    with pytest.raises(PackagesError, match="hadoop-client-api"):
        packages.hadoop_version(["hadoop-client-runtime-3.5.0.jar"])


def test_coordinates_follow_the_installed_spark() -> None:
    """Delta's artifact carries the Spark minor; Spark's own modules carry Spark's full version."""
    build = SparkBuild(spark="4.2.0", hadoop="3.5.0")
    assert build.minor == "4.2"
    assert packages.delta(build) == f"io.delta:delta-spark_4.2_2.13:{packages.delta_version()}"
    assert packages.hadoop_aws(build) == "org.apache.hadoop:hadoop-aws:3.5.0"
    assert packages.spark_sql_kafka(build) == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert packages.spark_avro(build) == "org.apache.spark:spark-avro_2.13:4.2.0"


def test_every_session_asks_for_one_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Sessions share one resolution (a subset may settle conflicts on versions never downloaded)."""
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path))
    build = SparkBuild(spark="4.2.0", hadoop="3.5.0")
    options = packages.session_options(build)
    assert options["spark.jars.packages"].split(",") == packages.all_packages(build)
    assert len(packages.all_packages(build)) == len(packages.PACKAGES)
    assert options["spark.jars.ivy"] == str(tmp_path / "ivy2")
    settings = Path(options["spark.jars.ivySettings"])
    assert settings.parent == tmp_path and "m2compatible" in settings.read_text()
    assert options["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_cache_dir_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """MQD_CACHE_DIR wins, then XDG_CACHE_HOME/mqd, then ~/.cache/mqd."""
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("MQD_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "mqd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "mqd"
