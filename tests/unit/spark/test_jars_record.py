"""A resolution's jars are recorded and handed to later sessions (no Ivy at start), as ``spark.jars``
or, on a local master, on the class path; only for the very request that was resolved and only while
every jar is there: pure rules, no JVM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mqd.spark import packages
from mqd.spark.packages import SparkBuild

BUILD = SparkBuild(spark="4.2.0", hadoop="3.5.0")


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path))
    return tmp_path


def _jars(cache: Path, n: int = 3) -> list[Path]:
    folder = cache / "ivy2" / "jars"
    folder.mkdir(parents=True, exist_ok=True)
    jars = [folder / f"org.example_a{i}-1.0.jar" for i in range(n)]
    for jar in jars:
        jar.write_bytes(b"PK")
    return jars


def test_without_a_record_spark_resolves(cache: Path) -> None:
    options = packages.session_options(BUILD)
    assert options["spark.jars.packages"].split(",") == packages.all_packages(BUILD)
    assert "spark.jars" not in options
    assert options["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_recorded_resolution_is_handed_over_as_jars(cache: Path) -> None:
    """What a session's resolution left in its ``spark.jars`` (file: URIs) is what the next gets."""
    jars = _jars(cache)
    recorded = packages.record_resolution(",".join(f"file://{j}" for j in jars), BUILD)
    assert recorded == jars
    options = packages.session_options(BUILD)
    assert options["spark.jars"].split(",") == [str(j) for j in jars]
    assert not {"spark.jars.packages", "spark.jars.ivy", "spark.jars.ivySettings"} & set(options)
    assert options["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def test_a_local_master_gets_the_recorded_jars_on_its_class_path(cache: Path) -> None:
    """On a local master the recorded jars go on the driver's class path, not ``spark.jars``: the
    executor, a thread of the same JVM, would copy every jar (700 MB) into its scratch folder."""
    jars = _jars(cache)
    packages.record_resolution(",".join(str(j) for j in jars), BUILD)
    options = packages.session_options(BUILD, local=True)
    assert options["spark.driver.extraClassPath"].split(os.pathsep) == [str(j) for j in jars]
    assert not {"spark.jars", "spark.jars.packages"} & set(options)
    assert options["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_local_master_without_a_record_resolves(cache: Path) -> None:
    options = packages.session_options(BUILD, local=True)
    assert options["spark.jars.packages"].split(",") == packages.all_packages(BUILD)
    assert "spark.driver.extraClassPath" not in options


def test_a_missing_jar_means_resolving_again(cache: Path) -> None:
    jars = _jars(cache)
    packages.record_resolution(",".join(map(str, jars)), BUILD)
    jars[1].unlink()
    assert packages.resolved_jars(BUILD) is None
    assert "spark.jars.packages" in packages.session_options(BUILD)


def test_another_request_means_resolving_again(cache: Path) -> None:
    """Another pyspark (or delta-spark, or exclusion list) asks for other coordinates: the record
    of the old request does not answer it, whatever its jars are."""
    packages.record_resolution(",".join(map(str, _jars(cache))), BUILD)
    assert packages.resolved_jars(BUILD) is not None
    assert packages.resolved_jars(SparkBuild(spark="4.2.1", hadoop="3.5.0")) is None
    record = json.loads(packages.resolved_path().read_text())
    record["request"]["excludes"] = record["request"]["excludes"][1:]
    packages.resolved_path().write_text(json.dumps(record))
    assert packages.resolved_jars(BUILD) is None


@pytest.mark.parametrize("text", ["", "{", "[]", '{"request": null, "jars": []}'])
def test_an_unreadable_record_means_resolving_again(cache: Path, text: str) -> None:
    packages.resolved_path().parent.mkdir(parents=True, exist_ok=True)
    packages.resolved_path().write_text(text)
    assert packages.resolved_jars(BUILD) is None


def test_nothing_is_recorded_for_jars_that_are_not_there(cache: Path) -> None:
    packages.record_resolution(f"file://{cache}/nowhere.jar", BUILD)
    packages.record_resolution("", BUILD)
    assert not packages.resolved_path().exists()
