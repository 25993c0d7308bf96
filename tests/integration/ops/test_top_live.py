"""`mqd top` against a real daemon that is stopped and started again under it: the view says the
daemon is not running and waits, then shows the restarted daemon's partitions; it never exits on
a stopped daemon or a connection error (issue 17: it used to exit when the daemon restarted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from support.cli import mqd, produce, write_config
from support.harness import Cluster

from mqd.waiting import wait_until_sync


class Output:
    """A process's stdout collected line by line on a thread, so the test can wait on its text."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def since(self, start: int) -> str:
        return "\n".join(self.lines[start:])

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def test_top_survives_a_daemon_restart(tmp_path: Path, cluster_factory: Callable[..., Cluster]) -> None:
    """Daemon up: top shows its partitions with exact offsets; stopped: "daemon not running ...
    waiting" (top still runs); started again: the new pid's partitions come back; Ctrl-C ends top
    with exit 0."""
    cluster = cluster_factory(topics={"events": 2})
    produce(cluster, 1500)
    cfg = write_config(tmp_path, cluster)
    state = tmp_path / "state"
    res = mqd("start", "-c", str(cfg))
    assert res.returncode == 0, res.stderr
    first_pid = int((state / "mqd.pid").read_text())
    top = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqd.operator.cli",
            "top",
            "-c",
            str(cfg),
            "--interval",
            "0.2",
            "--iterations",
            "3000",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "160"},
    )
    out = Output(top)
    try:
        wait_until_sync(
            lambda: all(s in out.since(0) for s in (f"pid {first_pid}", "events:1", "landed 1500 records")),
            timeout=30,
            what="top shows the daemon's partitions and the 1500 records landed",
        )
        res = mqd("stop", "-c", str(cfg))
        assert res.returncode == 0, res.stdout + res.stderr
        mark = len(out.lines)
        wait_until_sync(
            lambda: "daemon not running" in out.since(mark) and "waiting..." in out.since(mark),
            timeout=30,
            what="top says the daemon is not running",
        )
        assert top.poll() is None, out.since(0)
        res = mqd("start", "-c", str(cfg))
        assert res.returncode == 0, res.stderr
        second_pid = int((state / "mqd.pid").read_text())
        assert second_pid != first_pid
        mark = len(out.lines)
        wait_until_sync(
            lambda: f"pid {second_pid}" in out.since(mark) and "events:1" in out.since(mark),
            timeout=30,
            what="top shows the restarted daemon",
        )
        assert top.poll() is None
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=30) == 0, out.since(0)
        out.join(10)
        assert "Traceback" not in out.since(0)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(timeout=10)
        mqd("stop", "-c", str(cfg), "--force")
