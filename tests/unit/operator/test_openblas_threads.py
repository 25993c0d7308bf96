"""The mqd command loads numpy's OpenBLAS without its thread pool (mqd/operator/cli.py): after the
CLI's import, ``import numpy`` starts no thread (OpenBLAS's pool spins at start, ~0.1 CPU-s of a
run on 2 cores); a thread count the operator set, in any variable OpenBLAS reads, is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os
import mqd.operator.cli
before = len(os.listdir("/proc/self/task"))
import numpy
print(json.dumps({
    "threads_added": len(os.listdir("/proc/self/task")) - before,
    "openblas": os.environ.get("OPENBLAS_NUM_THREADS"),
}))
"""
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no pool on one core")


def _probe(**env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=clean | env
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_command_loads_numpy_without_a_blas_thread_pool() -> None:
    assert _probe() == {"threads_added": 0, "openblas": "1"}


def test_a_thread_count_the_operator_set_is_kept() -> None:
    got = _probe(OMP_NUM_THREADS="2")
    assert got == {"threads_added": 1, "openblas": None}  # two threads: the pool adds one
