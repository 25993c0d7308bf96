"""The byte budget bounds what a Kafka source's decoded records hold, not only the answer bodies.

The mqd broker's batches are zero-copy slices of the answer, so pinning the answer body charges
them. A Kafka decode copies the records out of the answer (varints into Arrow buffers, after
decompression), so the body is freed at once and the decoded buffers, often larger than the wire
bytes, went uncharged: drained batches held by the landing did not press the budget. Now each
decode's allocation is pinned like a body (``Decoded.held``). Real Tansu and Apache Kafka on
127.0.0.1, records produced with librdkafka (lz4, random values: as large decoded as on the wire,
so answers stay small next to the budget).
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path
from typing import Any

import pytest
from support.consumer import count_records, new_consumer, records
from support.kafka import Broker, Produced, kafka_daemon_config, produce

from mqd.consumer import TopicPartition
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

PARTITIONS, PER_PARTITION, VALUE = 4, 2000, 200
BUDGET = 256 * 1024


async def test_held_decoded_batches_keep_the_budget_charged(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A consumer with budget_held whose caller keeps every drained batch: fetching stops near the
    budget (the decoded bytes held stay within it plus one answer per partition), far short of the
    backlog; dropping them lets fetching resume, and every record arrives exactly once."""
    broker.create_topic(topic, PARTITIONS)
    rows: list[Produced] = [
        (p, None, b"%d:%d:" % (p, i) + os.urandom(VALUE), [])
        for i in range(PER_PARTITION)
        for p in range(PARTITIONS)
    ]
    produce(broker.bootstrap, rows, codec="lz4", topic=topic)
    cfg = kafka_daemon_config(
        broker.bootstrap,
        tmp_path,
        topic=topic,
        consumer={
            "max_buffered_bytes": BUDGET,
            "partition_max_bytes": 32 * 1024,
            "fetch_max_bytes": 64 * 1024,
            "fetch_max_wait_ms": 100,
        },
    ).consumer
    total = PARTITIONS * PER_PARTITION
    async with new_consumer(cfg, budget_held=True) as consumer:
        bb = consumer._budget
        held: list[Any] = []

        def drain() -> bool:
            held.extend(consumer.fetched_batches())
            return consumer.memory_bound()

        await wait_until(drain, 30, "fetching held back by the budget")
        decoded = sum(b.records.nbytes for b in held)
        assert count_records(held) < total // 2, "fetching went on past the budget"
        # an answer is charged when it arrives: each may overshoot by a partition's share
        assert decoded <= BUDGET + PARTITIONS * 64 * 1024
        assert bb.pinned >= decoded // 2  # the decoded buffers are what is charged now
        got: dict[TopicPartition, list[tuple[int, bytes]]] = {}

        def take(batches: list[Any]) -> int:
            for tp, part in records(batches).items():
                got.setdefault(tp, []).extend(part)
            return sum(len(r) for r in got.values())

        take(held)
        held.clear()  # the caller drops its batches: their memory is freed, fetching resumes
        deadline = time.monotonic() + 60
        while take(consumer.fetched_batches()) < total:
            assert time.monotonic() < deadline, "fetching did not resume after the drop"
            await consumer.wait_for_data(0.2)
        for p in range(PARTITIONS):
            tp = TopicPartition(topic, p)
            assert [o for o, _ in got[tp]] == list(range(PER_PARTITION))
            assert [v[: len(b"%d:%d:" % (p, i))] for i, (_, v) in enumerate(got[tp])] == [
                b"%d:%d:" % (p, i) for i in range(PER_PARTITION)
            ]
        got.clear()
        gc.collect()
        await wait_until(lambda: bb.pinned == 0, 10, "every decoded allocation released")
