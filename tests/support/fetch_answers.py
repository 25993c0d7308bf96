"""Fetch answers without a broker, for the fetch-answer callback's unit tests
(tests/unit/consumer/test_answers.py, test_partition_error_age.py): a FetchManager on a one-group
layout (master ``m``, slave ``s``), stored batches from mqd.wire.format, an answer framed with
mqd.wire.protocol as a node sends it, and ``deliver``, which hands one to the manager for partition ``TP``
as if it answered a request sent at a given position."""

from __future__ import annotations

from typing import Any

from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager, _Sent
from mqd.consumer.source import FetchResult
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.wire import format
from mqd.wire.metadata import ClusterMetadata
from mqd.wire.protocol import Status, decode_fetch_answer, encode_fetch_answer

TP = TopicPartition("events", 0)


def layout(partitions: int = 1) -> dict[str, Any]:
    """One broker group (master ``m``, slave ``s``) serving ``events`` partitions 0 .. partitions-1."""
    return {
        "groups": [
            {
                "name": "broker-a",
                "nodes": [
                    {"id": "m", "url": "http://127.0.0.1:1", "role": "master", "alive": True},
                    {"id": "s", "url": "http://127.0.0.1:2", "role": "slave", "alive": True},
                ],
            }
        ],
        "topics": [
            {
                "name": "events",
                "partitions": [
                    {"partition": p, "group": "broker-a", "master": "m", "replicas": ["s"]}
                    for p in range(partitions)
                ],
            }
        ],
    }


LAYOUT = layout()


def batches(*ranges: tuple[int, int]) -> bytes:
    """Stored batches: one per (base_offset, count), values b"<offset>"."""
    return b"".join(
        format.encode_batch([str(o).encode() for o in range(base, base + n)], base_offset=base)
        for base, n in ranges
    )


def manager(**cfg: Any) -> FetchManager:
    config = ConsumerConfig(**{"error_backoff_ms": 10, "bootstrap": ["http://127.0.0.1:1"], **cfg})
    source = MqdBrokerSource(config)
    source.metadata.current = ClusterMetadata.parse(LAYOUT)
    state = SubscriptionState(FlowLimits(), ByteBudget(config.max_buffered_bytes))
    return FetchManager(config=config, source=source, state=state)


def answer(
    status: Status,
    next_offset: int,
    data: bytes = b"",
    *,
    min_offset: int = 0,
    max_offset: int = 100,
    suggest: str | None = None,
    node: str = "m",
) -> FetchResult:
    entry = {
        "topic": TP.topic,
        "partition": TP.partition,
        "status": status.value,
        "next_offset": next_offset,
        "min_offset": min_offset,
        "max_offset": max_offset,
        "suggest": suggest,
    }
    return MqdBrokerSource._result(decode_fetch_answer(b"".join(encode_fetch_answer(node, [entry], [data]))))


def deliver(
    m: FetchManager, position: int, ans: FetchResult, node: str = "m", sent_epoch: int | None = None
) -> Any:
    ps = m.state.partitions.get(TP) or m.state.assign(TP, position, node)
    sent = [_Sent(ps, ps.epoch if sent_epoch is None else sent_epoch, position)]
    m.handle_answer(node, ans, sent)
    return ps
