"""The admin endpoint's listener (mqd/operator/admin_listener.py): the port is bound at start, the
endpoint is built at the first connection and serves the connections that waited for it; a taken
port fails the start; a failed build closes the port and is reported; stop() is idempotent at
every stage. Real sockets on 127.0.0.1, the real AdminServer."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import aiohttp
import pytest

from mqd.config import AdminConfig
from mqd.operator.admin import AdminServer, PartitionSpec
from mqd.operator.admin_listener import AdminListener, AdminListenError, bind

WAIT_S = 20.0


class Target:
    """What the endpoint serves: a running daemon with nothing assigned."""

    def status(self) -> dict[str, Any]:
        return {"state": "running"}

    def liveness(self) -> tuple[bool, str]:
        return True, "ok"

    def readiness(self) -> tuple[bool, list[str]]:
        return True, []

    def pause(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        return []

    def resume(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        return []


class Builds:
    """The listener's build: counts its calls, optionally held until ``release`` or failing."""

    def __init__(self, config: AdminConfig, *, hold: bool = False, fail: bool = False) -> None:
        self.config = config
        self.calls = 0
        self.fail = fail
        self.entered = threading.Event()
        self._go = threading.Event()
        if not hold:
            self._go.set()

    def release(self) -> None:
        self._go.set()

    def __call__(self) -> AdminServer:
        self.calls += 1
        self.entered.set()
        assert self._go.wait(WAIT_S)
        if self.fail:
            raise ImportError("no module named 'aiohttp.web' (a broken install)")
        return AdminServer(self.config, Target())


async def _get(url: str, path: str) -> tuple[int, str]:
    timeout = aiohttp.ClientTimeout(total=WAIT_S)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url + path) as r:
        return r.status, await r.text()


def _refused(url: str) -> bool:
    host, port = url[len("http://") :].rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


async def test_the_endpoint_is_built_at_the_first_connection_and_serves_the_waiting_ones() -> None:
    """After start() the port listens and nothing was built; three requests sent at once while the
    build is held all get their answer once it is released, from one build; later requests are
    served by the same endpoint."""
    config = AdminConfig(port=0)
    builds = Builds(config, hold=True)
    failures: list[BaseException] = []
    listener = AdminListener(config, builds, failures.append)
    await listener.start()
    try:
        assert builds.calls == 0 and not listener.built
        requests = [asyncio.create_task(_get(listener.url, p)) for p in ("/healthz", "/readyz", "/status")]
        assert await asyncio.to_thread(builds.entered.wait, WAIT_S)
        assert not any(r.done() for r in requests)  # they wait in the backlog
        builds.release()
        answers = await asyncio.wait_for(asyncio.gather(*requests), WAIT_S)
        assert [status for status, _ in answers] == [200, 200, 200], answers
        assert '"running"' in answers[2][1]
        assert await _get(listener.url, "/healthz") == answers[0]
        assert builds.calls == 1 and listener.built and failures == []
    finally:
        await listener.stop()
        await listener.stop()
    assert _refused(listener.url)


async def test_a_taken_port_fails_the_start_with_the_address() -> None:
    """A second listener on a bound port fails at start(), retriable, naming host and port; the
    first still serves."""
    config = AdminConfig(port=0)
    first = AdminListener(config, Builds(config), lambda exc: None)
    await first.start()
    try:
        port = int(first.url.rsplit(":", 1)[1])
        second = AdminListener(AdminConfig(port=port), Builds(config), lambda exc: None)
        with pytest.raises(AdminListenError) as info:
            await second.start()
        assert f"127.0.0.1:{port}" in str(info.value) and info.value.retriable
        await second.stop()  # nothing bound: nothing to do
        assert (await _get(first.url, "/healthz"))[0] == 200
    finally:
        await first.stop()


async def test_a_failed_build_closes_the_port_and_is_reported() -> None:
    """The build raises at the first connection: on_failure hears the error, the waiting connection
    is closed without an answer, and the port refuses connections from then on."""
    config = AdminConfig(port=0)
    failures: list[BaseException] = []
    listener = AdminListener(config, Builds(config, fail=True), failures.append)
    await listener.start()
    try:
        with pytest.raises(aiohttp.ClientError):
            await _get(listener.url, "/healthz")
        assert len(failures) == 1 and isinstance(failures[0], ImportError), failures
        assert _refused(listener.url)
    finally:
        await listener.stop()
        await listener.stop()


async def test_stop_during_the_build_waits_for_it_and_closes_everything() -> None:
    """stop() while the build is held returns once the build ended, the built endpoint
    never started on the sockets, which close: the request that started the build gets no answer."""
    config = AdminConfig(port=0)
    builds = Builds(config, hold=True)
    listener = AdminListener(config, builds, lambda exc: None)
    await listener.start()
    request = asyncio.create_task(_get(listener.url, "/healthz"))
    assert await asyncio.to_thread(builds.entered.wait, WAIT_S)
    stopping = asyncio.create_task(listener.stop())
    await asyncio.sleep(0)
    assert not stopping.done()
    builds.release()
    await asyncio.wait_for(stopping, WAIT_S)
    assert _refused(listener.url)
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(request, WAIT_S)


def test_port_zero_binds_every_address_of_a_name_on_one_port() -> None:
    """``localhost`` may name 127.0.0.1 and ::1: with port 0 both sockets get the same port, so the
    one URL in admin.json reaches whichever the client resolves first."""
    sockets = bind("localhost", 0)
    try:
        assert len({s.getsockname()[1] for s in sockets}) == 1
        families = {s.family for s in sockets}
        assert socket.AF_INET in families or socket.AF_INET6 in families
    finally:
        for s in sockets:
            s.close()


def test_an_address_literal_is_bound_without_the_idna_codec() -> None:
    """Binding 127.0.0.1 and localhost loads no ``encodings.idna``: socket.getaddrinfo loads that
    codec (stringprep's tables, ~17 ms of CPU at every daemon start) for a str host, so an ASCII
    host goes to it as bytes. A fresh interpreter, as the daemon's start is."""
    script = (
        "import sys\n"
        "from mqd.operator.admin_listener import bind\n"
        "for host in ('127.0.0.1', 'localhost'):\n"
        "    for s in bind(host, 0):\n"
        "        s.close()\n"
        "print('encodings.idna' in sys.modules)\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False"], res.stdout
