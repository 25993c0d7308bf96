"""Spark's packages come from mqd's cache: resolved once by Spark itself (make install), then
offline, without a single jar that pyspark already ships."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mqd.spark import packages

pytestmark = pytest.mark.spark


def _artifact(jar: str) -> str:
    """``group_artifact-1.2.3.jar`` (Ivy's retrieve pattern) or ``artifact-1.2.3.jar`` -> artifact."""
    name = jar.split("_", 1)[1] if "_" in jar and "." in jar.split("_", 1)[0] else jar
    return re.sub(r"-\d[\w.]*(-[A-Za-z0-9]+)?\.jar$", "", name)


def test_no_package_jar_is_one_that_pyspark_ships() -> None:
    """PROVIDED_BY_PYSPARK keeps every duplicate out: two versions of Hadoop's client, Parquet or
    Jackson on one classpath is what breaks jobs in ways no error message names."""
    import pyspark

    jars_dir = packages.ivy_dir() / "jars"
    assert jars_dir.is_dir(), f"{jars_dir} is missing: make install resolves the Spark packages"
    ours = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    resolved = {_artifact(p.name) for p in jars_dir.glob("*.jar")}
    assert {"delta-spark_4.2_2.13", "hadoop-aws", "spark-avro_2.13"} <= resolved
    assert resolved & ours == set()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_session_resolves_every_package_offline() -> None:
    """In a network namespace with only loopback, a session still gets every package: the cache is
    enough (what a test run, a demo and a restarted job on a closed network rely on)."""
    script = f"ip link set lo up && SPARK_LOCAL_IP=127.0.0.1 {sys.executable} -m mqd.spark.packages"
    out = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = packages.all_packages()
    printed = out.stdout.splitlines()  # after Ivy's own lines (it writes to stdout too)
    assert printed[-len(expected) - 1 : -1] == expected
    assert re.fullmatch(r"\d+ jars in .*", printed[-1])
