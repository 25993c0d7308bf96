"""Helpers for the consumer's integration tests: fast configs, producing numbered records, draining
a consumer, node stats."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any

from mqd.config import ConsumerConfig
from mqd.consumer import Consumer, FetchedBatch, TopicPartition
from mqd.sources import open_source
from mqd.wire import format
from mqd.wire.client import BrokerClient, ProduceResult
from support.harness import Cluster

_ids = itertools.count()

# short intervals so every test takes seconds
FAST: dict[str, Any] = {
    "fetch_max_wait_ms": 200,
    "heartbeat_interval": 0.2,
    "session_timeout": 3.0,
    "rebalance_interval": 2.0,
    "metadata_refresh_interval": 1.0,
    "commit_interval": 0.3,
    "request_timeout": 5.0,
    "error_backoff_ms": 50,
    "error_backoff_max_ms": 400,
}


def new_consumer(config: ConsumerConfig, *, client: BrokerClient | None = None, **kw: Any) -> Consumer:
    """A Consumer over the source ``config`` names, as its callers build it (``client``: the
    mqd broker source shares it)."""
    return Consumer(config, source=open_source(config, client=client), **kw)


def config(cluster: Cluster, **overrides: Any) -> ConsumerConfig:
    values: dict[str, Any] = {
        **FAST,
        "group": "g",
        "client_id": f"c{next(_ids)}-{time.monotonic_ns() % 10**6}",
        "bootstrap": [cluster.bootstrap],
        "topics": ["events"],
        "consume_from": "first",
    }
    values.update(overrides)
    return ConsumerConfig(**values)


def master_url(cluster: Cluster, partition: int) -> str:
    return cluster.url(cluster.master(cluster.broker_group_of(partition)))


async def produce(
    client: BrokerClient,
    cluster: Cluster,
    partition: int,
    values: list[bytes],
    topic: str = "events",
    timestamp: int | None = None,
    acks: str = "master",
    url: str | None = None,
) -> ProduceResult:
    ts = None if timestamp is None else [timestamp] * len(values)
    raw = format.encode_batch(values, timestamps=ts)
    return await client.produce(url or master_url(cluster, partition), topic, partition, raw, acks=acks)


async def produce_numbered(
    client: BrokerClient,
    cluster: Cluster,
    partitions: Iterable[int],
    count: int,
    per_batch: int = 10,
    topic: str = "events",
    start: int = 0,
) -> None:
    """``count`` records per partition, values ``b"<partition>:<i>"``, ``per_batch`` per batch."""
    for p in partitions:
        for lo in range(start, start + count, per_batch):
            hi = min(lo + per_batch, start + count)
            await produce(client, cluster, p, [f"{p}:{i}".encode() for i in range(lo, hi)], topic=topic)


def records(batches: Iterable[FetchedBatch]) -> dict[TopicPartition, list[tuple[int, bytes]]]:
    """(offset, value) per partition, in the order received."""
    out: dict[TopicPartition, list[tuple[int, bytes]]] = {}
    for b in batches:
        offsets = b.records.column("offset").to_pylist()
        values = b.records.column("value").to_pylist()
        assert offsets[0] == b.first_offset and offsets[-1] == b.next_offset - 1
        out.setdefault(b.tp, []).extend(zip(offsets, values, strict=True))
    return out


async def collect(
    consumer: Consumer,
    until: Callable[[list[FetchedBatch]], bool],
    timeout: float = 10.0,
    max_bytes: int | None = None,
) -> list[FetchedBatch]:
    """Drain ``consumer`` until ``until(all batches so far)`` holds; bounded by ``timeout``."""
    got: list[FetchedBatch] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        left = deadline - time.monotonic()
        if left <= 0:
            counts = {str(tp): len(v) for tp, v in records(got).items()}
            raise TimeoutError(f"timed out after {timeout}s; got {counts}; status {consumer.status()}")
        await consumer.wait_for_data(min(left, 0.2))
        got.extend(consumer.fetched_batches(max_bytes))
    return got


def count_records(batches: list[FetchedBatch]) -> int:
    return sum(b.next_offset - b.first_offset for b in batches)


def stats(cluster: Cluster, node_id: str) -> dict[str, Any]:
    data = cluster.get_json(node_id, "/v1/stats")
    assert data is not None, f"{node_id} did not answer /v1/stats"
    return data
