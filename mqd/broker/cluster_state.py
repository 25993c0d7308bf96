"""Cluster layout (from config) and liveness (from probing every peer's /v1/health).

Every node holds the same layout; ``alive`` is this node's own view. A peer counts as alive until
``liveness_timeout_ms`` have passed since its last good answer (and, at start, since the node
started), so a freshly started cluster does not see its peers as down before the first probe.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from typing import Any

import structlog

from mqd.config import BrokerConfig, BrokerGroupSpec, ClusterConfig, NodeSpec
from mqd.wire.client import BrokerClient, BrokerError

log = structlog.get_logger(__name__)


class ClusterState:
    """The layout queries the server needs, plus the liveness prober."""

    def __init__(
        self,
        config: BrokerConfig,
        cluster: ClusterConfig,
        client: BrokerClient,
        on_liveness_change: Callable[[], None] | None = None,
    ) -> None:
        found = cluster.node(config.node_id)
        if found is None:
            raise ValueError(f"node {config.node_id!r} is not in the cluster layout")
        self.config = config
        self.cluster = cluster
        self.broker_group, self.node = found
        self.node_id = config.node_id
        self._client = client
        self._on_change = on_liveness_change
        self._interval = config.liveness_interval_ms / 1000
        self._timeout = config.liveness_timeout_ms / 1000
        self._peers: list[NodeSpec] = [n for g in cluster.groups for n in g.nodes if n.id != self.node_id]
        now = time.monotonic()
        self._last_ok: dict[str, float] = {n.id: now for n in self._peers}
        self._alive: dict[str, bool] = {n.id: True for n in self._peers}
        self._task: asyncio.Task[None] | None = None
        # (topic, partition) pairs this node's broker group holds, in layout order
        self.partitions: list[tuple[str, int]] = [
            (t.name, p)
            for t in cluster.topics
            for p in range(t.partitions)
            if (g := cluster.broker_group_of(t.name, p)) is not None and g.name == self.broker_group.name
        ]
        self._held = set(self.partitions)

    # -- layout ------------------------------------------------------------------------------------

    @property
    def is_master(self) -> bool:
        return self.node.role == "master"

    def holds(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._held

    def broker_group_of(self, topic: str, partition: int) -> BrokerGroupSpec | None:
        return self.cluster.broker_group_of(topic, partition)

    def node_spec(self, node_id: str) -> NodeSpec | None:
        found = self.cluster.node(node_id)
        return found[1] if found else None

    def alive(self, node_id: str) -> bool:
        return node_id == self.node_id or self._alive.get(node_id, False)

    def live_slaves(self) -> list[NodeSpec]:
        return [n for n in self.broker_group.slaves if self.alive(n.id)]

    def coordinator(self, consumer_group: str) -> NodeSpec:
        """The coordinator of a consumer group: the master of broker group
        ``groups[crc32(consumer_group) % n]``; while it is down, that broker group's first live slave."""
        g = self.cluster.groups[zlib.crc32(consumer_group.encode()) % len(self.cluster.groups)]
        if self.alive(g.master.id):
            return g.master
        return next((n for n in g.slaves if self.alive(n.id)), g.master)

    def metadata(self) -> dict[str, Any]:
        groups = [
            {
                "name": g.name,
                "nodes": [
                    {"id": n.id, "url": n.url, "role": n.role, "alive": self.alive(n.id)} for n in g.nodes
                ],
            }
            for g in self.cluster.groups
        ]
        topics = []
        for t in self.cluster.topics:
            parts = []
            for p in range(t.partitions):
                g = self.cluster.broker_group_of(t.name, p)
                assert g is not None
                parts.append(
                    {
                        "partition": p,
                        "group": g.name,
                        "master": g.master.id,
                        "replicas": [n.id for n in g.slaves],
                    }
                )
            topics.append({"name": t.name, "partitions": parts})
        return {"cluster_version": 1, "node": self.node_id, "groups": groups, "topics": topics}

    # -- liveness ----------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None and self._peers:
            now = time.monotonic()
            self._last_ok = {n.id: now for n in self._peers}
            self._task = asyncio.create_task(self._probe_loop(), name="liveness")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._probe(n) for n in self._peers))
            changed = False
            now = time.monotonic()
            for n in self._peers:
                alive = now - self._last_ok[n.id] <= self._timeout
                if alive != self._alive[n.id]:
                    self._alive[n.id] = alive
                    changed = True
                    log.warning("peer liveness changed", peer=n.id, alive=alive)
            if changed and self._on_change is not None:
                self._on_change()
            await asyncio.sleep(self._interval)

    async def _probe(self, node: NodeSpec) -> None:
        try:
            await self._client.health(node.url, timeout=min(self._timeout, max(self._interval, 0.2)))
        except BrokerError:
            return
        self._last_ok[node.id] = time.monotonic()
