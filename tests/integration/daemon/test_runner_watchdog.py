"""Watchdog pings follow the daemon's working loop: a stuck loop stops them and fails /healthz."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqd.config import MqdConfig
from mqd.process.daemon import Daemon
from mqd.process.runner import Runner
from mqd.process.sdnotify import Notifier
from mqd.process.state import RunnerState


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    yield sock, path
    sock.close()


def _drain(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


async def _count_pings(sock: socket.socket, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    pings = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        pings += sum(1 for m in _drain(sock) if m == b"WATCHDOG=1")
    return pings


async def test_pings_stop_while_the_loop_is_stuck(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    """With a fresh last_loop_time the runner pings at half the interval; once the loop goes silent
    for longer than that it withholds pings and reports itself not live; it resumes when the loop does."""
    sock, path = notify_socket
    config = MqdConfig()
    daemon = Daemon(config)  # built, never started: no I/O
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    runner = Runner(tmp_path / "mqd.toml", config, notifier=notifier, daemon=daemon)
    runner._set_state(RunnerState.RUNNING)
    assert notifier.watchdog_interval == 0.4

    async def keep_turning() -> None:
        while True:
            daemon.last_loop_time = time.monotonic()
            await asyncio.sleep(0.02)

    turning = asyncio.create_task(keep_turning())
    watchdog = asyncio.create_task(runner._watchdog(0.4))
    try:
        assert await _count_pings(sock, 0.7) >= 2
        assert runner.liveness()[0]

        turning.cancel()
        daemon.last_loop_time = time.monotonic() - 60  # the loop is stuck
        _drain(sock)
        assert await _count_pings(sock, 0.7) == 0
        live, why = runner.liveness()
        assert not live and "silent" in why
        status, reasons = runner.health()
        assert status == "degraded" and any("silent" in r for r in reasons)

        turning = asyncio.create_task(keep_turning())
        assert await _count_pings(sock, 0.7) >= 1
    finally:
        turning.cancel()
        watchdog.cancel()
        await asyncio.gather(turning, watchdog, return_exceptions=True)
        notifier.close()


def test_runner_state_is_not_ready_before_running(tmp_path: Path) -> None:
    """Before the daemon runs, /readyz says no (with the reason) while /healthz says alive."""
    config = MqdConfig()
    runner = Runner(tmp_path / "mqd.toml", config, notifier=Notifier({}), daemon=Daemon(config))
    ready, reasons = runner.readiness()
    assert not ready and reasons == ["daemon is starting"]
    assert runner.liveness() == (True, "starting")
    st = runner.status()
    assert st["state"] == "starting" and st["health"]["status"] == "degraded"
    assert st["runner"]["reload"]["count"] == 0
