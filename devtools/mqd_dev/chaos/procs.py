"""Real processes for chaos runs: broker nodes behind fault proxies, and daemons.

Everything here is driven from one asyncio loop that also runs the proxies, so nothing may block:
the processes are mqd.testing's ManagedProcess, started with Popen (fast) and waited for with its
async methods (``stop_async``, ``wait_ready_async``).

Each node listens on a private port; the cluster file names the node's *proxy* URL, so every client
(daemons, the load, the slaves replicating from their master) goes through a proxy. The chaos process
talks to a node's private port only to check health and to read the logs back at the end.

Children get ``PR_SET_PDEATHSIG(SIGKILL)``: if the chaos process dies, the kernel kills them, so no
run leaves brokers or daemons behind.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from mqd.testing import (
    ManagedProcess,
    NodeProcess,
    cluster_toml,
    free_port,
    group_names,
    node_toml,
    replica_credentials,
)
from mqd_dev.chaos.proxy import FaultProxy


class Proc(ManagedProcess):
    """A child of the chaos run (mqd.testing's process manager): it dies with the chaos process, and
    ``unasked_exit`` reports an exit nobody asked for (once), which the supervisor counts as a crash."""

    def __init__(self, name: str, argv: list[str], log_path: Path, cwd: Path, env: Mapping[str, str]) -> None:
        super().__init__(name, argv, log_path, cwd=cwd, env=env, die_with_parent=True)


class Node(NodeProcess):
    """A broker node: listens on ``port``; everyone else reaches it through ``proxy``. Like
    :class:`Proc`, it dies with the chaos process and ``unasked_exit`` reports a crash once."""

    def __init__(
        self, node_id: str, group: str, role: str, root: Path, env: Mapping[str, str], seed: int
    ) -> None:
        port = free_port()
        super().__init__(node_id, group, role, port, root, "http", env=env, die_with_parent=True)
        self.proxy = FaultProxy(port, seed=seed)

    @property
    def direct_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """What the cluster file and every client use: the proxy in front of the node."""
        return self.proxy.url


# a broker's start or restart until it answers /v1/health: 17 s for one alone at load 36; 30 s failed
# the first start (4 nodes at once) of three runs and a segment_truncate restart
BROKER_START_TIMEOUT = 120.0


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

    async def start(self, timeout: float = BROKER_START_TIMEOUT) -> None:
        for n in self.nodes.values():
            await n.proxy.start()
        self._write_configs()
        for n in self.nodes.values():
            n.start()
        for n in self.nodes.values():
            await self.wait_healthy(n, timeout)

    def _write_configs(self) -> None:
        topics = [{"name": self.topic, "partitions": self.partitions}]
        self.cluster_path.write_text(cluster_toml(self.group_names, self.nodes.values(), topics))
        creds = replica_credentials(self.cluster_path, self.cluster_path.parent / "credentials")
        for n in self.nodes.values():
            settings = dict(self.node_settings)
            if n.id in creds:  # nodes of groups with slaves prove who they are to each other
                settings["replica_credentials"] = str(creds[n.id])
            body = node_toml(n.id, self.cluster_path, n.data_dir, n.port, settings)
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
        """Until the node answers /v1/health directly; ProcessError if it exits first, TimeoutError
        after ``timeout``."""

        async def healthy() -> bool:
            return await self.health(node, 0.5) is not None

        await node.wait_ready_async(healthy, timeout, interval=0.1)

    async def restart(self, node: Node, timeout: float = BROKER_START_TIMEOUT) -> None:
        node.start()
        await self.wait_healthy(node, timeout)

    async def stop(self) -> None:
        for n in self.nodes.values():
            await n.stop_async(signal.SIGTERM, timeout=10.0)
        for n in self.nodes.values():
            await n.proxy.stop()

    def kill_all_now(self) -> None:
        for n in self.nodes.values():
            n.kill_now()


_START_BANNER = b"===== start "  # ManagedProcess writes it to the log at every start
_STARTED = b'"daemon started"'  # logged after the runner installed its signal handlers


_QUERY_STARTED = b"spark_query_started"  # mqd spark: its SIGTERM handler is in place by then


def spark_started_in_log(log: bytes) -> bool:
    """Whether ``mqd spark``'s log shows a query started since the last start banner."""
    return _QUERY_STARTED in log[log.rfind(_START_BANNER) :]


def started_in_log(log: bytes) -> bool:
    """Whether the daemon's JSON log shows it started since the last start banner."""
    return _STARTED in log[log.rfind(_START_BANNER) :]


class DaemonProc(Proc):
    """One ``mqd run`` daemon with its own config file and state dir, sharing the landing dir."""

    def __init__(self, name: str, config_path: Path, root: Path, env: Mapping[str, str]) -> None:
        self.config_path = config_path
        super().__init__(
            name,
            [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(config_path)],
            root / f"{name}.log",
            root,
            env,
        )

    def started(self) -> bool:
        """Started since its last (re)start: its SIGTERM handler is installed, so a SIGTERM now
        is a graceful stop (before it, during the imports, SIGTERM kills it with -15)."""
        try:
            return started_in_log(self.log_path.read_bytes())
        except OSError:
            return False
