"""The CLI as a user runs it, against real daemons: a daemon config file, `mqd ...` as its own
process, and producing test records with `mqd produce`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.harness import Cluster, to_toml

SHUTDOWN_TIMEOUT = 10.0


def write_config(tmp_path: Path, cluster: Cluster, **sections: dict[str, Any]) -> Path:
    """``tmp_path/mqd.toml`` for a daemon of ``cluster`` (admin on a free port, state and landing
    under ``tmp_path``); ``sections`` override keys per section."""
    data: dict[str, Any] = {
        "consumer": {
            "bootstrap": [cluster.bootstrap],
            "topics": ["events"],
            "consume_from": "first",
            "commit_interval": 0.5,
            "heartbeat_interval": 0.5,
        },
        "landing": {"dir": str(tmp_path / "landing"), "max_age": 0.3},
        "admin": {"port": 0},
        "log": {"level": "info", "format": "json"},
        "daemon": {
            "state_dir": str(tmp_path / "state"),
            "pid_file": str(tmp_path / "state" / "mqd.pid"),
            "log_file": str(tmp_path / "state" / "mqd.log"),
            "shutdown_timeout": SHUTDOWN_TIMEOUT,
        },
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "mqd.toml"
    path.write_text(to_toml(data))
    return path


def mqd(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as its own process."""
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def produce(cluster: Cluster, count: int, *extra: str, batch: int = 250) -> None:
    """``count`` records to topic ``events`` with `mqd produce`."""
    res = mqd(
        "produce",
        "--bootstrap",
        cluster.bootstrap,
        "--topic",
        "events",
        "--count",
        str(count),
        "--batch",
        str(batch),
        *extra,
    )
    assert res.returncode == 0, res.stderr
