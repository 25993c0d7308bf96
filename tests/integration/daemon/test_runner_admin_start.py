"""The runner's start order around the admin endpoint (issue 34): the daemon's working loop does not
wait for the endpoint's imports and bind, READY=1 and "mqd running" do, and an endpoint that cannot
start once records flow still ends the process with exit code 1 and its reason.

The daemon here is a stand-in that records when its working loop was entered and stopped (the
runner's part is what is tested; the real daemon's start order is test_startup_imports'); the
endpoint's factory blocks on a thread until the test lets it go, as an import would."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

from mqd.config import AdminConfig, MqdConfig
from mqd.consumer import Consumer
from mqd.errors import MqdError
from mqd.operator.admin import AdminServer
from mqd.operator.admin_listener import AdminListener
from mqd.process.runner import EXIT_FAILURE, EXIT_OK, Runner, admin_file, last_exit_file
from mqd.process.sdnotify import Notifier
from mqd.process.state import DaemonSnapshot
from mqd.testing.configfiles import daemon_section
from mqd.waiting import wait_until

WAIT_S = 20.0


class StandInDaemon:
    """Starts at once; its working loop runs until the runner's shutdown awaitable completes."""

    def __init__(self) -> None:
        self.last_loop_time = 0.0
        self.stats: dict[str, Any] = {}
        self.running = asyncio.Event()
        self.stopped = False

    @property
    def consumer(self) -> Consumer:
        raise AssertionError("not used here")

    async def start(self) -> None: ...

    async def run(self, shutdown: Awaitable[None] | None = None) -> None:
        self.running.set()
        assert shutdown is not None
        await shutdown

    async def stop(self, timeout: float | None = None) -> None:
        self.stopped = True

    def snapshot(self) -> DaemonSnapshot:
        raise RuntimeError("not used here")

    def health(self) -> tuple[str, list[str]]:
        return "ok", []

    async def reload(self, config: MqdConfig) -> None: ...

    def pause(self, tps: Iterable[Any]) -> None: ...

    def resume(self, tps: Iterable[Any]) -> None: ...


class Endpoint:
    """An admin endpoint whose start succeeds, or fails as a taken port does."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.started = False
        self.stopped = False

    @property
    def url(self) -> str:
        return "http://127.0.0.1:9"

    async def start(self) -> None:
        if self.fail:
            raise MqdError("admin endpoint cannot listen on 127.0.0.1:9: address in use", retriable=True)
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


class BlockedFactory:
    """The endpoint's factory, held on its thread until ``release``."""

    def __init__(self, fail: bool = False) -> None:
        self.endpoint = Endpoint(fail)
        self.entered = threading.Event()
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def __call__(self, config: AdminConfig, target: Any) -> Endpoint:
        self.entered.set()
        assert self._go.wait(WAIT_S)
        return self.endpoint


class Recorder(Notifier):
    """sd_notify without a socket: what the runner told the service manager."""

    def __init__(self) -> None:
        super().__init__({})
        self.readies: list[str | None] = []

    def ready(self, status: str | None = None) -> bool:
        self.readies.append(status)
        return True


def _runner(tmp_path: Path, factory: BlockedFactory) -> tuple[Runner, StandInDaemon, Recorder]:
    config = MqdConfig.model_validate({"daemon": daemon_section(tmp_path / "state")})
    daemon = StandInDaemon()
    notifier = Recorder()
    return (
        Runner(tmp_path / "mqd.toml", config, notifier=notifier, daemon=daemon, admin=factory),
        daemon,
        notifier,
    )


async def test_the_working_loop_runs_while_the_admin_endpoint_starts(tmp_path: Path) -> None:
    """While the endpoint's factory is still blocked the daemon's working loop is running and no
    READY=1 went out; once the endpoint is up READY=1 follows, admin.json names it, and a stop
    ends the run with exit code 0 and the endpoint stopped."""
    factory = BlockedFactory()
    runner, daemon, notifier = _runner(tmp_path, factory)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(daemon.running.wait(), WAIT_S)
        assert factory.entered.is_set() and not factory.endpoint.started
        assert notifier.readies == []
        factory.release()
        await wait_until(lambda: notifier.readies != [], timeout=WAIT_S, what="READY=1")
        assert factory.endpoint.started
        assert json.loads(admin_file(runner.config).read_text())["url"] == factory.endpoint.url
        runner.request_stop("test")
        assert await asyncio.wait_for(run, WAIT_S) == EXIT_OK
    finally:
        factory.release()
        if not run.done():
            run.cancel()
    assert daemon.stopped and factory.endpoint.stopped
    assert not admin_file(runner.config).exists()


async def test_an_admin_endpoint_that_fails_after_the_start_ends_the_process(tmp_path: Path) -> None:
    """The working loop is running when the endpoint's bind fails: the runner stops the daemon,
    never says READY=1, and exits 1 with the endpoint's reason in last_exit.json."""
    factory = BlockedFactory(fail=True)
    runner, daemon, notifier = _runner(tmp_path, factory)
    run = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(daemon.running.wait(), WAIT_S)
        factory.release()
        assert await asyncio.wait_for(run, WAIT_S) == EXIT_FAILURE
    finally:
        factory.release()
        if not run.done():
            run.cancel()
    assert daemon.stopped and notifier.readies == []
    last_exit = json.loads(last_exit_file(runner.config).read_text())
    assert last_exit["exit_code"] == EXIT_FAILURE
    assert last_exit["reason"].startswith("admin endpoint failed: admin endpoint cannot listen"), last_exit


async def test_an_admin_endpoint_whose_build_fails_at_the_first_connection_ends_the_process(
    tmp_path: Path,
) -> None:
    """The CLI's endpoint binds at start and is built at the first connection: when that build
    fails (a broken install), the runner stops the daemon and exits 1 with the build's error in
    last_exit.json, as when the endpoint fails during the start (it exited 0 before admin_failed)."""

    def broken() -> AdminServer:
        raise ImportError("no module named 'aiohttp.web' (a broken install)")

    def factory(config: AdminConfig, runner: Runner) -> AdminListener:
        return AdminListener(config, broken, runner.admin_failed)

    config = MqdConfig.model_validate({"daemon": daemon_section(tmp_path / "state"), "admin": {"port": 0}})
    daemon = StandInDaemon()
    runner = Runner(tmp_path / "mqd.toml", config, notifier=Recorder(), daemon=daemon, admin=factory)
    run = asyncio.create_task(runner.run())
    try:
        await wait_until(admin_file(config).exists, timeout=WAIT_S, what="admin.json")
        host, port = json.loads(admin_file(config).read_text())["url"][len("http://") :].rsplit(":", 1)
        _reader, writer = await asyncio.open_connection(host, int(port))
        writer.close()
        assert await asyncio.wait_for(run, WAIT_S) == EXIT_FAILURE
    finally:
        if not run.done():
            run.cancel()
    assert daemon.stopped
    last_exit = json.loads(last_exit_file(config).read_text())
    assert last_exit["exit_code"] == EXIT_FAILURE
    assert "admin endpoint failed: ImportError" in last_exit["reason"], last_exit
