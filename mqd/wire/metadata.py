"""The cluster layout as clients see it: one parsed ``GET /v1/metadata`` answer (docs/protocol.md).

The consumer's mqd broker source (mqd.sources.mqd_broker.metadata_cache caches and refreshes it)
and the producer both route with it.
Standard library only, so every client can import it.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mqd.errors import MqdError
from mqd.topic_partition import TopicPartition

__all__ = ["ClusterMetadata", "MetadataError", "NodeInfo", "PartitionInfo", "TopicPartition"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    url: str
    role: str  # "master" | "slave"
    broker_group: str
    alive: bool


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    tp: TopicPartition
    broker_group: str
    master: str
    replicas: tuple[str, ...]


class MetadataError(MqdError, ValueError):
    """A metadata answer that does not have the documented shape (retriable: ask another node)."""

    retriable = True


class ClusterMetadata:
    """One snapshot of the layout: broker groups, nodes, partition -> broker group/master/replicas."""

    def __init__(
        self,
        nodes: dict[str, NodeInfo],
        broker_groups: list[tuple[str, list[str]]],
        partitions: dict[TopicPartition, PartitionInfo],
        version: int = 0,
    ) -> None:
        self.nodes = nodes
        self.broker_groups = broker_groups  # in cluster order: the coordinator lookup indexes into it
        self.partitions = partitions
        self.version = version
        self.topics: dict[str, list[TopicPartition]] = {}
        for tp in sorted(partitions):
            self.topics.setdefault(tp.topic, []).append(tp)

    @classmethod
    def parse(cls, data: Any) -> ClusterMetadata:
        try:
            nodes: dict[str, NodeInfo] = {}
            broker_groups: list[tuple[str, list[str]]] = []
            for g in data["groups"]:
                name = str(g["name"])
                ids = []
                for n in g["nodes"]:
                    node = NodeInfo(
                        id=str(n["id"]),
                        url=str(n["url"]).rstrip("/"),
                        role=str(n["role"]),
                        broker_group=name,
                        alive=bool(n.get("alive", True)),
                    )
                    nodes[node.id] = node
                    ids.append(node.id)
                broker_groups.append((name, ids))
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
            meta = cls(nodes, broker_groups, partitions, int(data.get("cluster_version", 0)))
        except MetadataError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MetadataError(f"malformed metadata answer: {type(exc).__name__}: {exc}") from exc
        for topic, tps in meta.topics.items():
            if [tp.partition for tp in tps] != list(range(len(tps))):
                raise MetadataError(f"malformed metadata answer: topic {topic!r}: partitions are not 0..n-1")
        return meta

    def partitions_for(self, topics: Iterable[str]) -> list[TopicPartition]:
        """Sorted partitions of ``topics`` (RocketMQ's mqSet); unknown topics contribute none."""
        out: list[TopicPartition] = []
        for t in sorted(set(topics)):
            out.extend(self.topics.get(t, ()))
        return out

    def master_url(self, tp: TopicPartition) -> tuple[str, bool]:
        """(url, alive) of the partition's master, as the answering node saw it."""
        node = self.nodes[self.partitions[tp].master]
        return node.url, node.alive

    def is_alive(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.alive

    def candidates(self, tp: TopicPartition) -> list[str]:
        """Nodes that can serve reads of ``tp``, master first."""
        info = self.partitions.get(tp)
        if info is None:
            return []
        return [info.master, *info.replicas]

    def coordinator(self, consumer_group: str) -> NodeInfo | None:
        """Master of ``broker_groups[crc32(consumer_group) % n]``, or its first live slave while down."""
        if not self.broker_groups:
            return None
        _, ids = self.broker_groups[zlib.crc32(consumer_group.encode()) % len(self.broker_groups)]
        members = [self.nodes[i] for i in ids]
        ordered = [n for n in members if n.role == "master"] + [n for n in members if n.role != "master"]
        for n in ordered:
            if n.alive:
                return n
        return ordered[0] if ordered else None
