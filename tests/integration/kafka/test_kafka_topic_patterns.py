"""Topic patterns (``consumer.topics = ["re:^events-.*"]``) against a real Kafka-protocol broker
(Tansu and Apache Kafka on 127.0.0.1) and real mqd brokers: a matching topic created after the
daemon started is picked up by the next metadata refresh and landed under its own name; a pattern
that matches nothing is a warning in status, not an error (issue 17)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.daemon import daemon_config
from support.harness import Cluster
from support.kafka import Broker, kafka_daemon_config, produce
from support.landing import read_manifest

from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire.producer import Producer

pytest.importorskip("confluent_kafka")


def _landed(landing: Path, topic: str) -> int:
    try:
        return sum(r.count for r in read_manifest(landing, topic))
    except FileNotFoundError:
        return 0


async def test_a_topic_created_later_that_matches_is_landed(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A group member subscribed by pattern lands the matching topic it found at start, then a
    topic created while it runs (next refresh, group rejoined), never the topic that does not
    match; the pattern that matches nothing is listed in status."""
    first, later, other = f"{topic}-a", f"{topic}-b", f"other-{topic}"
    broker.create_topic(first, 2)
    broker.create_topic(other, 1)
    produce(broker.bootstrap, [(i % 2, None, b"a%d" % i, []) for i in range(100)], topic=first)
    produce(broker.bootstrap, [(0, None, b"o%d" % i, []) for i in range(10)], topic=other)
    nothing = f"re:^nothing-{re.escape(topic)}-.*"
    cfg = kafka_daemon_config(
        broker.bootstrap,
        tmp_path,
        consumer={
            "mode": "cluster",
            "group": f"patterns-{topic}",
            "topics": [f"re:^{re.escape(topic)}-.*", nothing],
        },
        max_age=0.2,
    )
    landing = tmp_path / "landing"
    d = Daemon(cfg)
    stop: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    run = asyncio.create_task(d.run(stop))
    try:
        await wait_until(lambda: _landed(landing, first) == 100, timeout=60, what=f"{first} landed")
        status = d.status()
        assert status["subscription"]["topics"] == [first]
        assert status["subscription"]["unmatched_patterns"] == [nothing]
        await asyncio.to_thread(broker.create_topic, later, 3)
        await asyncio.to_thread(
            produce, broker.bootstrap, [(i % 3, None, b"b%d" % i, []) for i in range(60)], topic=later
        )
        await wait_until(lambda: _landed(landing, later) == 60, timeout=60, what=f"{later} landed")
        assert d.status()["subscription"]["topics"] == [first, later]
        assert _landed(landing, other) == 0
    finally:
        stop.set_result(None)
        await asyncio.wait_for(run, 60)
    assert _landed(landing, first) == 100 and _landed(landing, later) == 60


async def test_mqd_brokers_pattern_subscription(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """With mqd brokers the group is told concrete topics (the broker refuses a pattern as a topic
    name): a pattern over two topics lands both, exactly once."""
    cluster = cluster_factory(topics={"events-x": 2, "events-y": 2, "other": 1})
    async with Producer(cluster.bootstrap) as producer:
        for topic in ("events-x", "events-y", "other"):
            await producer.send(topic, [b"%d" % i for i in range(50)])
    cfg = daemon_config(cluster, tmp_path, consumer={"topics": ["re:events-.", "other"], "group": "pat"})
    d = Daemon(cfg, burst=True)
    await asyncio.wait_for(d.run(), 60)
    landing = tmp_path / "landing"
    assert [_landed(landing, t) for t in ("events-x", "events-y", "other")] == [50, 50, 50]
