"""A host without pyspark (the base package, no ``mqd[spark]`` extra): brokers, ``mqd produce``, the
daemon, ``mqd status`` and ``mqd config check`` work, and ``mqd spark`` names the extra to install.

Every process here starts with a ``sitecustomize`` on PYTHONPATH whose import hook refuses pyspark
and py4j and writes down each attempt: the test proves both that these commands work without pyspark
and that they never even try to import it (every pyspark import is lazy)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from support.cli import write_config
from support.daemon import assert_exactly_once
from support.harness import Cluster

_BLOCKER = '''
import os
import sys


class _NoPyspark:
    """Behave as if pyspark and py4j were not installed; write down every attempt."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in ("pyspark", "py4j"):
            with open(os.environ["NO_PYSPARK_ATTEMPTS_FILE"], "a") as f:
                f.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, _NoPyspark())
'''


def _env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    hook = tmp_path / "no_pyspark"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_BLOCKER)
    attempts = tmp_path / "pyspark_attempts.txt"
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "NO_PYSPARK_ATTEMPTS_FILE": str(attempts)}, attempts


def _mqd(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def test_the_blocker_blocks(tmp_path: Path) -> None:
    """The hook really hides pyspark (else the other test proves nothing) and records the attempt."""
    env, attempts = _env(tmp_path)
    res = subprocess.run(
        [sys.executable, "-c", "import pyspark"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert res.returncode == 1 and "blocked by the test" in res.stderr
    assert attempts.read_text().split() == ["pyspark"]


def test_daemon_broker_and_cli_work_without_pyspark(
    tmp_path: Path, cluster_factory: Callable[..., Cluster]
) -> None:
    """Brokers started without pyspark take 2,000 records from `mqd produce`; `mqd run --burst`
    lands them exactly once; help, `config check` and `status` answer; `mqd spark` exits 2 with
    ``pip install 'mqd[spark]'``; no process ever tried to import pyspark or py4j."""
    env, attempts = _env(tmp_path)
    cluster = cluster_factory(topics={"events": 2}, env=env)
    cfg = write_config(tmp_path, cluster)

    for args in (["--help"], ["run", "--help"], ["config", "check", str(cfg)]):
        res = _mqd(env, *args)
        assert res.returncode == 0, (args, res.stderr)

    res = _mqd(env, "produce", "--bootstrap", cluster.bootstrap, "--topic", "events", "--count", "2000")
    assert res.returncode == 0, res.stderr
    res = _mqd(env, "run", "--config", str(cfg), "--burst", timeout=120)
    assert res.returncode == 0, res.stderr
    assert_exactly_once(tmp_path, partitions=2, per_partition=1000)

    res = _mqd(env, "status", "--config", str(cfg))
    assert res.returncode == 3, res.stdout + res.stderr  # not running: it answered without pyspark

    assert not attempts.exists(), f"tried to import: {attempts.read_text()}"

    res = _mqd(env, "spark", "--config", str(cfg), "--once")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "pip install 'mqd[spark]'" in res.stderr
    assert "Traceback" not in res.stderr
