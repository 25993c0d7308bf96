"""A Kafka cluster's metadata as the engine sees it (mqd.consumer.source.Cluster), refreshed in the
background and on demand.

One MetadataRequest (aiokafka's struct, version negotiated per connection) to a known broker,
bootstrap servers last; the answer also feeds aiokafka's own ClusterMetadata so its connections know
every broker. Node ids are Kafka broker ids as text. A partition's route is its leader, then its
replicas (KIP-392 preferred read replicas are followed only to those); a partition without a leader
(-1) is routed to the node "-1", which never exists, so it waits for the next refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from mqd.backoff import Backoff
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import Cluster, Node, PartitionRoute
from mqd.sources.kafka.protocol_ext import MetadataRequest, split_metadata
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_event

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
            tp = TopicPartition(topic, partition)
            lead = str(leader) if leader >= 0 else NO_LEADER
            partitions[tp] = PartitionRoute(lead, tuple(str(r) for r in replicas if r != leader))
            tps.append(tp)
        topics[topic] = sorted(tps)
    return Cluster(nodes=nodes, partitions=partitions, topics=topics)


class KafkaMetadata:
    """The current Cluster of one AIOKafkaClient's cluster."""

    def __init__(
        self,
        client: AIOKafkaClient,
        *,
        refresh_interval: float,
        error_backoff: float,
        request_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._interval = refresh_interval
        self._timeout = request_timeout
        self._base_backoff = error_backoff
        self._backoff = Backoff(error_backoff, 5.0)
        self._clock = clock
        self.current: Cluster | None = None
        self.last_error: str | None = None
        self.refreshes = 0
        # Metadata v10+ (protocol_ext): topic -> topic id, partition -> leader epoch; empty before
        self.topic_ids: dict[str, str] = {}
        self.leader_epochs: dict[TopicPartition, int] = {}
        self._listeners: list[Callable[[Cluster], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Callable[[Cluster], None]) -> None:
        self._listeners.append(fn)

    def request_refresh(self) -> None:
        self._wake.set()

    async def start(self, timeout: float) -> None:
        """First refresh (retried until ``timeout``), then the background loop."""
        deadline = self._clock() + timeout
        backoff = Backoff(self._base_backoff, 2.0)
        while True:
            try:
                await self.refresh()
                break
            except ConsumerError as exc:
                delay = backoff.next()
                if self._clock() + delay > deadline:
                    raise ConsumerError(f"no Kafka broker answered metadata: {exc}", retriable=True) from exc
                await asyncio.sleep(delay)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-kafka-metadata")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
        cluster = to_cluster(resp)
        self.current = cluster
        self.last_error = None
        self.refreshes += 1
        for fn in self._listeners:
            try:
                fn(cluster)
            except Exception:
                log.exception("metadata listener failed")
        return cluster

    async def _run(self) -> None:
        while self._task is not None:
            await wait_event(self._wake, self._interval)
            self._wake.clear()
            try:
                await self.refresh()
            except ConsumerError as exc:
                log.warning("kafka metadata refresh failed", error=str(exc))
                await asyncio.sleep(self._backoff.next())
                self._wake.set()
            else:
                self._backoff.reset()
            await asyncio.sleep(0.05)  # never more often than every 50 ms, however many ask
