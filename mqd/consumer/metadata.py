"""Cluster metadata as the consumer sees it: parsed once per refresh, read everywhere.

Any reachable node answers ``GET /v1/metadata`` with the whole layout (docs/protocol.md). The cache
asks the nodes it already knows first and the bootstrap URLs last, refreshes every
``metadata_refresh_interval`` and at once when a fetcher reports a routing error or a dead node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from mqd.client import BrokerClient, BrokerError
from mqd.consumer.state import ConsumerError, TopicPartition, wait_event

log = structlog.get_logger("mqd.consumer.metadata")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    url: str
    role: str  # "master" | "slave"
    group: str
    alive: bool


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    tp: TopicPartition
    group: str
    master: str
    replicas: tuple[str, ...]


class MetadataError(ConsumerError):
    """A metadata answer that does not have the documented shape."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class ClusterMetadata:
    """One immutable snapshot of the layout: groups, nodes, partitions -> group/master/replicas."""

    def __init__(
        self,
        nodes: dict[str, NodeInfo],
        groups: list[tuple[str, list[str]]],
        partitions: dict[TopicPartition, PartitionInfo],
        version: int = 0,
    ) -> None:
        self.nodes = nodes
        self.groups = groups  # in cluster order: the coordinator lookup indexes into it
        self.partitions = partitions
        self.version = version
        self.topics: dict[str, list[TopicPartition]] = {}
        for tp in sorted(partitions):
            self.topics.setdefault(tp.topic, []).append(tp)

    @classmethod
    def parse(cls, data: Any) -> ClusterMetadata:
        try:
            nodes: dict[str, NodeInfo] = {}
            groups: list[tuple[str, list[str]]] = []
            for g in data["groups"]:
                name = str(g["name"])
                ids = []
                for n in g["nodes"]:
                    node = NodeInfo(
                        id=str(n["id"]),
                        url=str(n["url"]).rstrip("/"),
                        role=str(n["role"]),
                        group=name,
                        alive=bool(n.get("alive", True)),
                    )
                    nodes[node.id] = node
                    ids.append(node.id)
                groups.append((name, ids))
            partitions: dict[TopicPartition, PartitionInfo] = {}
            for t in data["topics"]:
                for p in t["partitions"]:
                    tp = TopicPartition(str(t["name"]), int(p["partition"]))
                    info = PartitionInfo(
                        tp, str(p["group"]), str(p["master"]), tuple(str(r) for r in p.get("replicas", ()))
                    )
                    if info.master not in nodes or any(r not in nodes for r in info.replicas):
                        raise MetadataError(f"metadata: partition {tp} names an unknown node")
                    partitions[tp] = info
            return cls(nodes, groups, partitions, int(data.get("cluster_version", 0)))
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MetadataError(f"malformed metadata answer: {type(exc).__name__}: {exc}") from exc

    def partitions_for(self, topics: Iterable[str]) -> list[TopicPartition]:
        """Sorted partitions of ``topics`` (RocketMQ's mqSet); unknown topics contribute none."""
        out: list[TopicPartition] = []
        for t in sorted(set(topics)):
            out.extend(self.topics.get(t, ()))
        return out

    def is_alive(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.alive

    def candidates(self, tp: TopicPartition) -> list[str]:
        """Nodes that can serve reads of ``tp``, master first."""
        info = self.partitions.get(tp)
        if info is None:
            return []
        return [info.master, *info.replicas]

    def coordinator(self, group: str) -> NodeInfo | None:
        """Master of ``groups[crc32(group) % len(groups)]``, or its first live slave while it is down."""
        if not self.groups:
            return None
        _, ids = self.groups[zlib.crc32(group.encode()) % len(self.groups)]
        members = [self.nodes[i] for i in ids]
        ordered = [n for n in members if n.role == "master"] + [n for n in members if n.role != "master"]
        for n in ordered:
            if n.alive:
                return n
        return ordered[0] if ordered else None


class MetadataCache:
    """The current ClusterMetadata, refreshed in the background and on demand."""

    def __init__(
        self,
        client: BrokerClient,
        bootstrap: list[str],
        *,
        refresh_interval: float,
        error_backoff: float = 0.1,
        request_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._bootstrap = [u.rstrip("/") for u in bootstrap]
        self._interval = refresh_interval
        self._timeout = request_timeout  # per node: a hung node must not stall the refresh
        self._base_backoff = error_backoff
        self._backoff = error_backoff
        self._clock = clock
        self.current: ClusterMetadata | None = None
        self.last_error: str | None = None
        self.refreshes = 0
        self._listeners: list[Callable[[ClusterMetadata], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Callable[[ClusterMetadata], None]) -> None:
        """``fn(metadata)`` runs after every successful refresh."""
        self._listeners.append(fn)

    async def start(self, timeout: float) -> None:
        """First refresh (retried until ``timeout``), then the background loop."""
        deadline = self._clock() + timeout
        delay = self._base_backoff
        while True:
            try:
                await self.refresh()
                break
            except ConsumerError as exc:
                if self._clock() + delay > deadline:
                    raise ConsumerError(
                        f"no broker answered metadata (tried {', '.join(self._urls())}): {exc}",
                        retriable=True,
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-metadata")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request_refresh(self) -> None:
        self._wake.set()

    def _urls(self) -> list[str]:
        urls: list[str] = []
        md = self.current
        if md is not None:
            nodes = sorted(md.nodes.values(), key=lambda n: not n.alive)
            urls.extend(n.url for n in nodes)
        urls.extend(u for u in self._bootstrap if u not in urls)
        return urls

    async def refresh(self) -> ClusterMetadata:
        """Ask known nodes (live ones first), then the bootstrap list; the first answer wins."""
        errors = []
        for url in self._urls():
            try:
                async with asyncio.timeout(self._timeout):
                    answer = await self._client.metadata(url)
                md = ClusterMetadata.parse(answer)
            except TimeoutError:
                errors.append(f"{url}: no answer within {self._timeout}s")
                continue
            except (BrokerError, MetadataError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            self.current = md
            self.last_error = None
            self.refreshes += 1
            for fn in self._listeners:
                try:
                    fn(md)
                except Exception:
                    log.exception("metadata listener failed")
            return md
        self.last_error = "; ".join(errors) or "no broker URL known"
        raise ConsumerError(f"metadata refresh failed: {self.last_error}", retriable=True)

    async def _run(self) -> None:
        while self._task is not None:  # stop() clears it before cancelling
            await wait_event(self._wake, self._interval)
            self._wake.clear()
            try:
                await self.refresh()
            except ConsumerError as exc:
                log.warning("metadata refresh failed", error=str(exc))
                await asyncio.sleep(self._backoff)
                self._wake.set()  # keep trying, paced by the backoff
                self._backoff = min(self._backoff * 2, 5.0)
            else:
                self._backoff = self._base_backoff
            # never refresh more often than every 50 ms, however many fetchers ask
            await asyncio.sleep(0.05)
