"""A session started from the recorded resolution (no Ivy) has Delta: it writes and reads a Delta
table, offline too, prints none of Ivy's resolution report, and on a local master copies none of the
jars into its scratch folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mqd.spark import packages

pytestmark = pytest.mark.spark

_SESSION = """
import os
import sys
from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.spark.packages import session_options
from mqd.spark.session import build_session

assert "spark.jars" in session_options() and "spark.jars.packages" not in session_options()
root = sys.argv[1]
cfg = MqdConfig(landing=LandingConfig(dir=root + "/landing"), spark=SparkConfig(master="local[1]"))
spark = build_session(cfg)
spark.range(5).write.format("delta").save(root + "/t")
print("rows", spark.read.format("delta").load(root + "/t").count())
from pyspark import SparkFiles
print("copied", sorted(os.listdir(SparkFiles.getRootDirectory())))
spark.stop()
"""


def test_a_session_from_the_record_has_delta_without_ivy(tmp_path: Path) -> None:
    if packages.resolved_jars() is None:  # make install's warm-up writes it; so does any session
        packages.warm()
    assert packages.resolved_jars() is not None
    cmd = [sys.executable, "-c", _SESSION, str(tmp_path)]
    if os.geteuid() == 0 and shutil.which("unshare") is not None:  # offline: loopback only
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows 5" in out.stdout
    assert "copied []" in out.stdout  # the jars are read where they are, not copied per session
    assert "resolving dependencies" not in out.stdout + out.stderr
