"""A Kafka cluster's metadata as the engine sees it (mqd.consumer.source.Cluster), refreshed in the
background and on demand.

One MetadataRequest (aiokafka's struct, version negotiated per connection) to a known broker,
bootstrap servers last; the answer also feeds aiokafka's own ClusterMetadata so its connections know
every broker. Node ids are Kafka broker ids as text. A partition's route is its leader, then its
replicas but the offline ones (Metadata v5+: on a failed log directory or a stopped broker); KIP-392
preferred read replicas are followed only to those; a partition without a leader (-1) is routed to
the node "-1", which never exists, so it waits for the next refresh.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from mqd.consumer.errors import ConsumerError
from mqd.consumer.metadata_refresh import MetadataRefresh
from mqd.consumer.source import Cluster, Node, PartitionRoute
from mqd.sources.kafka.protocol_ext import MetadataRequest, split_metadata
from mqd.topic_partition import TopicPartition

log = structlog.get_logger("mqd.sources.kafka.metadata")

NO_LEADER = "-1"


def to_cluster(resp: Any) -> Cluster:
    """The engine's view of one MetadataResponse (v1+): brokers, routes, sorted partitions per topic."""
    nodes = {str(b[0]): Node(str(b[0]), True, "master") for b in resp.brokers}
    partitions: dict[TopicPartition, PartitionRoute] = {}
    topics: dict[str, list[TopicPartition]] = {}
    for t in resp.topics:
        error_code, topic, _internal, parts = t[0], t[1], t[2], t[3]
        if error_code != 0:
            continue  # unknown or unauthorised topic: it has no partitions to consume
        tps = []
        for p in parts:
            _, partition, leader, replicas = p[0], p[1], p[2], p[3]
            offline = p[5] if len(p) > 5 else ()
            tp = TopicPartition(topic, partition)
            lead = str(leader) if leader >= 0 else NO_LEADER
            serving = tuple(str(r) for r in replicas if r != leader and r not in offline)
            partitions[tp] = PartitionRoute(lead, serving)
            tps.append(tp)
        topics[topic] = sorted(tps)
    return Cluster(nodes=nodes, partitions=partitions, topics=topics)


class KafkaMetadata(MetadataRefresh[Cluster]):
    """The current Cluster of one AIOKafkaClient's cluster."""

    task_name = "mqd-kafka-metadata"

    def __init__(
        self,
        client: AIOKafkaClient,
        *,
        refresh_interval: float,
        error_backoff: float,
        request_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            refresh_interval=refresh_interval,
            error_backoff=error_backoff,
            request_timeout=request_timeout,
            clock=clock,
            log=log,
        )
        self._client = client
        # Metadata v10+ (protocol_ext): topic -> topic id, partition -> leader epoch; empty before
        self.topic_ids: dict[str, str] = {}
        self.leader_epochs: dict[TopicPartition, int] = {}

    def _start_failed(self, exc: ConsumerError) -> str:
        return f"no Kafka broker answered metadata: {exc}"

    async def refresh(self) -> Cluster:
        """Ask the known brokers (in random order), then the bootstrap servers; raises ConsumerError."""
        cluster = self._client.cluster
        known = [b.nodeId for b in cluster.brokers()]
        random.shuffle(known)
        errors: list[str] = []
        for node_id in known:
            try:
                async with asyncio.timeout(self._timeout):
                    resp = await self._client.send(node_id, MetadataRequest(None))
            except (KafkaError, TimeoutError, OSError) as exc:
                errors.append(f"{node_id}: {exc!r}")
                continue
            return self._apply(resp)
        try:
            # every known broker failed: aiokafka bootstraps again from consumer.bootstrap
            async with asyncio.timeout(self._timeout * 2):
                await self._client.bootstrap()
            node_id = next(iter(cluster.brokers())).nodeId
            async with asyncio.timeout(self._timeout):
                resp = await self._client.send(node_id, MetadataRequest(None))
        except (KafkaError, TimeoutError, OSError, StopIteration) as exc:
            errors.append(f"bootstrap: {exc!r}")
            self.last_error = "; ".join(errors)
            raise ConsumerError(f"metadata refresh failed: {self.last_error}", retriable=True) from exc
        return self._apply(resp)

    def _apply(self, resp: Any) -> Cluster:
        resp, self.topic_ids, self.leader_epochs = split_metadata(resp)
        if resp.brokers:
            self._client.cluster.update_metadata(resp)
        return self._publish(to_cluster(resp))
