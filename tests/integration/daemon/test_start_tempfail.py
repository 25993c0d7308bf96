"""A daemon whose source does not answer within ``request_timeout`` at start exits 75 (sysexits'
EX_TEMPFAIL, like the Spark job without a session), not 1: the service manager starts it again, and
a supervisor (the chaos run, an operator's script) tells "the cluster was down" from a crash. Found
by ``make chaos SOURCE=kafka`` (seed 532354): a daemon restarted while Tansu was frozen exited 1
after 5 s and was counted as a crash."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.harness import to_toml

from mqd.testing.cluster import free_port


@pytest.mark.parametrize("source", ["mqd", "kafka"])
def test_unreachable_source_at_start_exits_75(tmp_path: Path, source: str) -> None:
    """Nothing listens on the bootstrap port: `mqd run` gives up after request_timeout (1 s) with
    exit code 75 and one error line that says a later start may succeed and names the servers."""
    port = free_port()
    cfg = tmp_path / "mqd.toml"
    cfg.write_text(
        to_toml(
            {
                "consumer": {
                    "source": source,
                    "bootstrap": [f"127.0.0.1:{port}" if source == "kafka" else f"http://127.0.0.1:{port}"],
                    "topics": ["events"],
                    "request_timeout": 1.0,
                },
                "landing": {"dir": str(tmp_path / "landing")},
                "admin": {"enabled": False},
                "log": {"format": "json"},
                "daemon": {
                    "state_dir": str(tmp_path / "state"),
                    "pid_file": str(tmp_path / "state" / "mqd.pid"),
                    "log_file": str(tmp_path / "state" / "mqd.log"),
                },
            }
        )
    )
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 75, out
    assert "cannot start now, a later start may succeed" in out
    assert str(port) in out
    assert time.monotonic() - started < 30
