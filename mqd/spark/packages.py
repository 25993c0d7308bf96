"""Spark packages: the Maven artifacts the job needs beside pyspark, resolved by Spark itself.

The pip pyspark carries Spark and Hadoop's client, not Delta Lake, S3A or Spark's Kafka source. Those
come as Spark packages: ``spark.jars.packages`` names Maven coordinates, and Spark resolves them
(Ivy, from Maven Central, with their dependencies) when its JVM starts. mqd points Spark's Ivy home
(``spark.jars.ivy``) at its own cache (:func:`mqd.cache.cache_dir`), so the first session
downloads and every later one reads the cache, offline too; ``make install`` warms it with
``python -m mqd.spark.packages``. On a cluster the same coordinates reach the executors through
Spark's own mechanism: nothing to copy by hand.

Every version is derived from what is installed, never typed twice: Delta's from the delta-spark
wheel (its Python API and its jar must agree), Spark's and Scala's from pyspark, Hadoop's from
pyspark's ``hadoop-client-api`` jar (hadoop-aws must match the Hadoop client exactly).

Resolved once, then handed over: Ivy's resolution from a warm cache still costs every start 2-7 s of
the JVM's CPU (parsing the poms of 17 modules) and ~30 lines of report, for the same answer each
time. So the jars a resolution gave are written down (:func:`record_resolution`, in the cache beside
the Ivy home, with what was asked: packages, excludes, Ivy settings) and later sessions get them as
``spark.jars``, which is what Spark makes of ``spark.jars.packages`` after resolving (local files
the driver serves to the executors). Anything different (another mqd, pyspark or delta-spark
version, a jar gone from the cache) falls back to Spark's resolution, which writes a new record.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mqd.cache import cache_dir
from mqd.errors import MqdError

SCALA = "2.13"  # every pyspark 4 release is built for Scala 2.13


class PackagesError(MqdError):
    """A Spark package cannot be named: pyspark or delta-spark is missing or not what mqd pins."""

    retriable = False


@dataclass(frozen=True)
class SparkBuild:
    """What the installed pyspark is: its version and the Hadoop client it ships."""

    spark: str
    hadoop: str

    @property
    def minor(self) -> str:
        return ".".join(self.spark.split(".")[:2])


def installed_build() -> SparkBuild:
    """The installed pyspark's Spark and Hadoop versions (no JVM started)."""
    try:
        import pyspark
    except ImportError:
        raise PackagesError("pyspark is not installed: pip install 'mqd[spark]'") from None
    jars = Path(pyspark.__file__).parent / "jars"
    return SparkBuild(spark=pyspark.__version__, hadoop=hadoop_version(p.name for p in jars.glob("hadoop-*")))


def hadoop_version(jar_names: Iterable[str]) -> str:
    """The Hadoop version of a ``hadoop-client-api-X.Y.Z.jar`` among ``jar_names``."""
    for name in jar_names:
        m = re.fullmatch(r"hadoop-client-api-(\d+\.\d+\.\d+)\.jar", name)
        if m:
            return m.group(1)
    raise PackagesError("pyspark's jars have no hadoop-client-api jar: cannot match hadoop-aws to it")


def delta_version() -> str:
    """The delta-spark wheel's version: its jar must be the same release."""
    try:
        return metadata.version("delta-spark")
    except metadata.PackageNotFoundError:
        raise PackagesError("delta-spark is not installed: pip install 'mqd[spark]'") from None


def delta(build: SparkBuild) -> str:
    """Delta Lake for this Spark: since 4.1 Delta publishes one artifact per Spark minor."""
    return f"io.delta:delta-spark_{build.minor}_{SCALA}:{delta_version()}"


def hadoop_aws(build: SparkBuild) -> str:
    """S3A (``s3a://``) for pyspark's Hadoop client; it brings the AWS SDK bundle it was built with."""
    return f"org.apache.hadoop:hadoop-aws:{build.hadoop}"


def spark_sql_kafka(build: SparkBuild) -> str:
    """Spark's own Kafka source (the benchmark's alternative to mqd)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{build.spark}"


def spark_avro(build: SparkBuild) -> str:
    return f"org.apache.spark:spark-avro_{SCALA}:{build.spark}"


# what each name on the command line (and in make install's warm-up) resolves
PACKAGES = {
    "delta": delta,
    "hadoop-aws": hadoop_aws,
    "spark-sql-kafka": spark_sql_kafka,
    "spark-avro": spark_avro,
}
# not here: spark-protobuf, which Maven Central does not serve for Spark 4.1 or 4.2

# What the packages depend on that pyspark's own jars already hold, in other versions (Delta pulls
# Hadoop 3.4's client, Parquet 1.16 and Jackson 2.13 into Spark 4.2's 3.5, 1.17 and 2.19): Spark's
# copies win on the classpath anyway, so resolving these would only download and load dead weight.
# tests/integration/spark/test_spark_packages_offline.py checks that no resolved jar is one of pyspark's.
PROVIDED_BY_PYSPARK = (
    "at.yawk.lz4:lz4-java",
    "com.fasterxml.jackson.core:jackson-annotations",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.github.luben:zstd-jni",
    "com.google.code.findbugs:jsr305",
    "commons-pool:commons-pool",
    "io.airlift:aircompressor",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson",
    "org.locationtech.jts:jts-core",
    "org.roaringbitmap:RoaringBitmap",
    f"org.scala-lang.modules:scala-parallel-collections_{SCALA}",
    "org.slf4j:slf4j-api",
    "org.tukaani:xz",
    "org.xerial.snappy:snappy-java",
)

# Ivy's settings for Spark's resolution: Maven Central only (ibiblio's default root). Spark's own
# chain also tries ~/.m2, where a partial download (a pom without its jar) failed the whole
# resolution, and spark-packages' repository, unreachable from a closed network.
_IVY_SETTINGS = """\
<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true"/>
  </resolvers>
</ivysettings>
"""


def ivy_dir() -> Path:
    """Spark's Ivy home: its ``cache/`` holds what was downloaded, ``jars/`` what a session used."""
    return cache_dir() / "ivy2"


def ivy_settings() -> Path:
    """The Ivy settings file Spark resolves with (written on first use, rewritten when it differs)."""
    path = cache_dir() / "ivysettings.xml"
    if not path.is_file() or path.read_text() != _IVY_SETTINGS:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_IVY_SETTINGS)
        tmp.replace(path)
    return path


def all_packages(build: SparkBuild | None = None) -> list[str]:
    """Every package, the one set each session asks for. Ivy settles version conflicts per set, so
    a subset can pick a version that the warm-up of another set never downloaded: one set means
    one resolution, warmed once, and every later session resolves from the cache, offline."""
    build = build or installed_build()
    return [PACKAGES[name](build) for name in sorted(PACKAGES)]


def resolve_options(build: SparkBuild | None = None) -> dict[str, str]:
    """The settings that make Spark resolve :func:`all_packages` into mqd's cache (Ivy, at start)."""
    return {
        "spark.jars.packages": ",".join(all_packages(build)),
        "spark.jars.excludes": ",".join(PROVIDED_BY_PYSPARK),
        "spark.jars.ivy": str(ivy_dir()),
        "spark.jars.ivySettings": str(ivy_settings()),
    }


def session_options(build: SparkBuild | None = None, *, local: bool = False) -> dict[str, str]:
    """The SparkSession settings that give it :func:`all_packages` from mqd's cache: the jars an
    earlier resolution of this very set recorded (no Ivy at start) when every one is still there,
    else Spark's resolution (:func:`resolve_options`); Delta's SQL extension and catalog either way.
    A session that resolved records its jars (:func:`record_resolution`).

    ``local`` (a ``local[...]`` master: the executors are threads of the driver's JVM): the jars go
    on the driver's class path. As ``spark.jars`` each session's executor would copy every one into
    its scratch folder (700 MB, most of it the AWS SDK bundle that hadoop-aws needs), a copy that a
    killed JVM never deletes. On a cluster they are ``spark.jars``, which Spark ships to the
    executors."""
    jars = resolved_jars(build)
    if not jars:
        packages = resolve_options(build)
    elif local:
        packages = {"spark.driver.extraClassPath": os.pathsep.join(str(j) for j in jars)}
    else:
        packages = {"spark.jars": ",".join(str(j) for j in jars)}
    return {**packages, **delta_options()}


def resolved_path() -> Path:
    """The record of the last resolution: what was asked and the jars it gave."""
    return cache_dir() / "spark-jars.json"


def _resolution_request(build: SparkBuild | None) -> dict[str, object]:
    """What decides a resolution's answer: the same request gets the same jars."""
    options = resolve_options(build)
    return {
        "packages": options["spark.jars.packages"].split(","),
        "excludes": options["spark.jars.excludes"].split(","),
        "ivy": options["spark.jars.ivy"],
        "ivy_settings": _IVY_SETTINGS,
    }


def resolved_jars(build: SparkBuild | None = None) -> list[Path] | None:
    """The jars Spark resolved for this request last time, if the record is for exactly this request
    and every jar is still a file; None otherwise (resolve again)."""
    try:
        record = json.loads(resolved_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("request") != _resolution_request(build):
        return None
    names = record.get("jars")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return None
    jars = [Path(n) for n in names]
    return jars if all(j.is_file() for j in jars) else None


def record_resolution(spark_jars: str, build: SparkBuild | None = None) -> list[Path]:
    """Write down the jars a session's resolution gave (its ``spark.jars``: ``file:`` URIs or
    paths, comma-separated) for the next sessions; returns them. Written whole or not at all: a
    concurrent reader sees the old record or the new one."""
    jars = [Path(j.removeprefix("file://").removeprefix("file:")) for j in spark_jars.split(",") if j]
    if not jars or not all(j.is_file() for j in jars):
        return jars  # nothing usable to record: the next session resolves again
    path = resolved_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    record = {"request": _resolution_request(build), "jars": [str(j) for j in jars]}
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return jars


def delta_options() -> Mapping[str, str]:
    """The session settings Delta's SQL (``OPTIMIZE``, ``VACUUM``, ``DESCRIBE HISTORY``) and its
    catalog need; the jar itself comes from :func:`delta`."""
    return {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    }


def warm() -> list[Path]:
    """Start a local session so that Spark resolves every package into the cache (always: this is
    the check that the cache answers the request), record the jars for later sessions and return
    them. Needs the network once; a warm cache needs none."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("mqd-packages")
    builder = builder.config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
    for key, value in {**resolve_options(), **delta_options()}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        jars = spark.sparkContext.getConf().get("spark.jars", "") or ""
    finally:
        spark.stop()
    return record_resolution(jars)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqd.spark.packages",
        description="Resolve Spark packages into mqd's cache (needs Maven Central once).",
    )
    parser.parse_args(argv)
    try:
        jars = warm()
    except MqdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for coordinate in all_packages():
        print(coordinate)
    print(f"{len(jars)} jars in {ivy_dir() / 'jars'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "PACKAGES",
    "PROVIDED_BY_PYSPARK",
    "PackagesError",
    "SparkBuild",
    "all_packages",
    "delta",
    "delta_options",
    "hadoop_aws",
    "hadoop_version",
    "installed_build",
    "ivy_dir",
    "ivy_settings",
    "record_resolution",
    "resolve_options",
    "resolved_jars",
    "resolved_path",
    "session_options",
    "spark_avro",
    "spark_sql_kafka",
    "warm",
]
