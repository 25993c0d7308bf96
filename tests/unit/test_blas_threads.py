"""One OpenBLAS thread in the commands that move records (mqd/blas_threads.py): a script named
``mqd`` run as ``mqd run`` loads numpy without OpenBLAS's thread pool (no thread more after
``import numpy`` than before); a thread count the user chose is kept; ``mqd spark`` and an
application that imports mqd load numpy as they always did, pool and all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, os, sys
import mqd
before = len(os.listdir("/proc/self/task"))
import numpy
print(json.dumps({
    "threads_added": len(os.listdir("/proc/self/task")) - before,
    "openblas": os.environ.get("OPENBLAS_NUM_THREADS"),
}))
"""

needs_cores = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no pool on one core")


def _probe(script: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    script.write_text(PROBE)
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    }
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean | (env or {}),
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@needs_cores
def test_mqd_run_loads_numpy_without_a_blas_thread_pool(tmp_path: Path) -> None:
    got = _probe(tmp_path / "mqd", "run", "--burst")
    assert got == {"threads_added": 0, "openblas": "1"}


@needs_cores
def test_a_thread_count_the_user_chose_is_kept(tmp_path: Path) -> None:
    got = _probe(tmp_path / "mqd", "broker", env={"OMP_NUM_THREADS": "2"})
    assert got["openblas"] is None and got["threads_added"] == 1  # 2 threads: the pool adds one


@needs_cores
def test_mqd_spark_and_applications_load_numpy_as_they_always_did(tmp_path: Path) -> None:
    assert _probe(tmp_path / "mqd", "spark")["openblas"] is None
    app = _probe(tmp_path / "app.py", "run")
    assert app["openblas"] is None and int(str(app["threads_added"])) >= 1
