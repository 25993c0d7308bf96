"""Real processes for chaos runs: broker nodes behind fault proxies, and daemons.

Everything here is driven from one asyncio loop that also runs the proxies, so nothing may block:
processes are spawned with Popen (fast) and every wait polls with ``asyncio.sleep``.

Each node listens on a private port; the cluster file names the node's *proxy* URL, so every client
(daemons, the load, the slaves replicating from their master) goes through a proxy. The chaos process
talks to a node's private port only to check health and to read the logs back at the end.

Children get ``PR_SET_PDEATHSIG(SIGKILL)``: if the chaos process dies, the kernel kills them, so no
run leaves brokers or daemons behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from mqd.chaos.proxy import FaultProxy
from mqd.errors import MqdError
from mqd.localcluster import broker_argv, cluster_toml, free_port, group_names, node_toml, spawn_logged

_PR_SET_PDEATHSIG = 1


class ChaosError(MqdError):
    """The chaos run could not do what it needed (a process would not start, a deadline passed)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message, retriable=retriable)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


async def wait_until(
    condition: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns a truthy value; ChaosError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ChaosError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)


class Proc:
    """One child process with its log file. ``exits`` counts exits we did not ask for."""

    def __init__(self, name: str, argv: list[str], log_path: Path, cwd: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self.stopping = False  # we are stopping it: its exit is not a crash
        self.unexpected_exits: list[int] = []

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self) -> None:
        if self.running:
            raise ChaosError(f"{self.name} is already running")
        self.proc = spawn_logged(
            self.argv,
            self.log_path,
            cwd=self.cwd,
            env=self.env,
            banner=f"start {self.name}",
            preexec_fn=_die_with_parent,
        )
        self.frozen = False
        self.stopping = False

    def check(self) -> int | None:
        """The exit code if the process exited without being asked to (and forget it), else None."""
        if not self.stopping and self.proc is not None and self.proc.poll() is not None:
            code = self.proc.returncode
            self.proc = None
            self.unexpected_exits.append(code)
            return code
        return None

    def send(self, sig: int) -> None:
        if not self.running:
            raise ChaosError(f"{self.name} is not running")
        assert self.proc is not None
        self.proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    async def terminate(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Send ``sig``; SIGKILL after ``timeout``. Waits (asynchronously) for the exit."""
        if self.proc is None:
            return None
        proc = self.proc
        self.stopping = True
        if proc.poll() is None:
            proc.send_signal(sig)
            if sig != signal.SIGKILL and self.frozen:
                proc.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
                while proc.poll() is None:
                    await asyncio.sleep(0.02)
        self.proc = None
        self.frozen = False
        self.stopping = False
        return proc.returncode

    def kill_now(self) -> None:
        """Synchronous last-resort cleanup (finally blocks, atexit)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.proc = None

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Node(Proc):
    """A broker node: listens on ``port``; everyone else reaches it through ``proxy``."""

    def __init__(
        self, node_id: str, group: str, role: str, root: Path, env: Mapping[str, str], seed: int
    ) -> None:
        self.id = node_id
        self.group = group
        self.role = role
        self.port = free_port()
        self.proxy = FaultProxy(self.port, seed=seed)
        self.config_path = root / f"{node_id}.toml"
        self.data_dir = root / "data" / node_id
        super().__init__(
            node_id,
            broker_argv(self.config_path),
            root / f"{node_id}.log",
            root,
            env,
        )

    @property
    def direct_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """What the cluster file and every client use."""
        return self.proxy.url


class ChaosCluster:
    """Broker groups (``broker-a``, ``broker-b``, ...) of one master and ``slaves`` slaves each.

    Partition ``i`` of the topic lives on group ``i % groups``.
    """

    def __init__(
        self,
        root: Path,
        *,
        topic: str,
        partitions: int,
        groups: int,
        slaves: int,
        seed: int,
        node_settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.group_names = group_names(groups)
        self.root = root
        self.topic = topic
        self.partitions = partitions
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.nodes: dict[str, Node] = {}
        for gi, g in enumerate(self.group_names):
            for i in range(slaves + 1):
                node_id = f"{g}-{i}"
                self.nodes[node_id] = Node(
                    node_id, g, "master" if i == 0 else "slave", root, self.env, seed * 1000 + gi * 10 + i
                )
        self.node_settings = dict(node_settings or {})
        self.cluster_path = root / "cluster.toml"

    def masters(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "master"]

    def slaves(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "slave"]

    def master_of(self, partition: int) -> Node:
        g = self.group_names[partition % len(self.group_names)]
        return next(n for n in self.nodes.values() if n.group == g and n.role == "master")

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes.values()]

    async def start(self, timeout: float = 30.0) -> None:
        for n in self.nodes.values():
            await n.proxy.start()
        self._write_configs()
        for n in self.nodes.values():
            n.spawn()
        for n in self.nodes.values():
            await self.wait_healthy(n, timeout)

    def _write_configs(self) -> None:
        topics = [{"name": self.topic, "partitions": self.partitions}]
        self.cluster_path.write_text(cluster_toml(self.group_names, self.nodes.values(), topics))
        for n in self.nodes.values():
            body = node_toml(n.id, self.cluster_path, n.data_dir, n.port, self.node_settings)
            n.config_path.write_text(body)

    async def health(self, node: Node, timeout: float = 1.0) -> dict[str, Any] | None:
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(node.direct_url + "/v1/health", timeout=aiohttp.ClientTimeout(total=timeout)) as resp,
            ):
                if resp.status != 200:
                    return None
                data = await resp.json()
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None

    async def wait_healthy(self, node: Node, timeout: float = 30.0) -> None:
        async def healthy() -> bool:
            if node.proc is not None and node.proc.poll() is not None:
                code = node.proc.returncode
                raise ChaosError(f"{node.id} exited with {code} while starting:\n{node.tail()}")
            return await self.health(node, 0.5) is not None

        await wait_until(healthy, timeout, f"{node.id} to be healthy", interval=0.1)

    async def restart(self, node: Node, timeout: float = 30.0) -> None:
        node.spawn()
        await self.wait_healthy(node, timeout)

    async def stop(self) -> None:
        for n in self.nodes.values():
            await n.terminate(signal.SIGTERM, timeout=10.0)
        for n in self.nodes.values():
            await n.proxy.stop()

    def kill_all_now(self) -> None:
        for n in self.nodes.values():
            n.kill_now()


class DaemonProc(Proc):
    """One ``mqd run`` daemon with its own config file and state dir, sharing the landing dir."""

    def __init__(self, name: str, config_path: Path, root: Path, env: Mapping[str, str]) -> None:
        self.config_path = config_path
        super().__init__(
            name,
            [sys.executable, "-m", "mqd.cli", "run", "--config", str(config_path)],
            root / f"{name}.log",
            root,
            env,
        )
