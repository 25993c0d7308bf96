"""A Fetch answer from a real broker (Tansu and Apache Kafka on 127.0.0.1) is read into one buffer
of its size and decoded from views of it: the answer, the records as decoded, and nothing else of
its size at once. aiokafka's own path held the answer three times over (a growing read buffer, its copy out,
each partition's records copied again) next to the decoded records."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.kafka import Broker, kafka_daemon_config, produce

from mqd.consumer.source import FetchRequest, FetchStatus
from mqd.sources.kafka.source import KafkaSource
from mqd.topic_partition import TopicPartition

pytest.importorskip("confluent_kafka")

_POOLS: list[pa.MemoryPool] = []
RECORDS = 40_000  # ~4.5 MB of batches: one answer far above every small transient


async def test_an_answer_is_held_once_while_it_is_decoded(broker: Broker, topic: str, tmp_path: Path) -> None:
    """Every record of the answer decodes; the answer's body is one buffer from Arrow's pool whose
    records the decode reads as views; and the memory's peak over the fetch and the decode (Python's
    allocations, traced, plus Arrow's pool's high-water) stays under 2.6 times the answer (the body,
    the decoded arena of ~1.2 times it, socket reads), where aiokafka's path peaked above 3 times."""
    broker.create_topic(topic, 1)
    produce(broker.bootstrap, [(0, None, b"v%099d" % i, []) for i in range(RECORDS)], topic=topic)
    source = KafkaSource(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic).consumer)
    await source.start(timeout=15)
    tp = TopicPartition(topic, 0)
    try:
        assert source.cluster is not None
        node = source.cluster.partitions[tp].leader
        request = [FetchRequest(tp, 0, 64 << 20)]
        # a first small fetch opens the connection, so only the answer is traced below
        await source.fetch(
            node, [FetchRequest(tp, RECORDS - 1, 1 << 20)], max_wait_ms=100, min_bytes=1, max_bytes=1 << 20
        )
        # the body and the arena come from Arrow's pool, which tracemalloc does not see: a proxy of
        # it counts them apart (kept alive for the process, as its buffers may outlive the test)
        pool = pa.proxy_memory_pool(pa.default_memory_pool())
        _POOLS.append(pool)
        before = pa.default_memory_pool()
        pa.set_memory_pool(pool)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            res = await source.fetch(node, request, max_wait_ms=100, min_bytes=1, max_bytes=64 << 20)
            (part,) = res.partitions
            decoded = part.decode(0, True)
            peak = tracemalloc.get_traced_memory()[1] - base + pool.max_memory()
        finally:
            tracemalloc.stop()
            pa.set_memory_pool(before)
        assert part.status is FetchStatus.FOUND
        assert sum(b.records.num_rows for b in decoded.batches) == RECORDS
        assert isinstance(res.body, np.ndarray) and res.nbytes > 4 << 20
        assert pool.max_memory() >= res.nbytes  # the body was read into the pool
        assert peak < 2.6 * res.nbytes, (
            f"peak {peak / 2**20:.1f} MiB for a {res.nbytes / 2**20:.1f} MiB answer"
        )
    finally:
        await source.stop()
