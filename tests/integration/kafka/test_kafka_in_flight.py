"""Pause and revoke with a fetch in flight, against a real broker (Tansu and Apache Kafka on 127.0.0.1): the
answer of a long poll sent before the partition was paused or revoked is dropped by the callback's
re-check (counted in mqd_stale_responses), and the records are fetched again by
whoever owns the partition next: none lost, none duplicated in the landing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.kafka import Broker, Produced, kafka_daemon_config, landed_rows, produce

from mqd import metrics
from mqd.consumer import TopicPartition
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

LONG_POLL_MS = 3000  # so that the pause or the rebalance happens while a fetch waits at the broker


def stale(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("mqd_stale_responses_total", {"reason": reason}) or 0.0


def in_flight(d: Daemon) -> bool:
    return any(n.in_flight for n in d.consumer.snapshot().nodes)


async def test_pause_with_a_fetch_in_flight_drops_the_answer_and_refetches_after_resume(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """The daemon is caught up and long-polling; partition 0 is paused while that fetch waits, then
    records arrive for it: the answer carrying them is dropped (counted as "paused"), nothing of
    partition 0 lands while paused, and after resume everything lands exactly once."""
    broker.create_topic(topic, 2)
    tp0 = TopicPartition(topic, 0)
    first: list[Produced] = [(i % 2, None, b"a-%d" % i, []) for i in range(100)]
    later: list[Produced] = [(0, None, b"b-%d" % i, []) for i in range(50)]
    produce(broker.bootstrap, first, topic=topic)
    d = Daemon(
        kafka_daemon_config(
            broker.bootstrap, tmp_path, topic=topic, consumer={"fetch_max_wait_ms": LONG_POLL_MS}, max_age=0.2
        )
    )
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 100, 30, "the first 100 landed")
        await wait_until(lambda: in_flight(d), 10, "a long poll in flight")
        dropped = stale("paused")
        d.pause([tp0])
        await asyncio.to_thread(produce, broker.bootstrap, later, topic=topic)
        await wait_until(
            lambda: stale("paused") > dropped, 2 * LONG_POLL_MS / 1000 + 10, "the answer dropped"
        )
        assert d.stats["records_published"] == 100  # nothing of partition 0 while paused
        d.resume([tp0])
        await wait_until(lambda: d.stats["records_published"] == 150, 30, "the paused records landed")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    got = landed_rows(tmp_path / "landing")
    assert sorted(r[0] for r in got[0]) == list(range(100)), "partition 0: lost or duplicated"
    assert sorted(r[0] for r in got[1]) == list(range(50)), "partition 1: lost or duplicated"
    assert [r[2] for r in sorted(got[0])][50:] == [v for _p, _k, v, _h in later]


async def test_revoke_with_fetches_in_flight_loses_and_duplicates_nothing(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A lands alone with a 3 s long poll in flight; B joins the group while records keep coming,
    so partitions are revoked from A while its fetch waits: that answer's results for them are
    dropped on arrival (counted as "revoked") and B fetches them from the landed position: every
    record lands exactly once."""
    partitions = 4
    broker.create_topic(topic, partitions)
    landing = tmp_path / "landing"

    def member(name: str) -> Daemon:
        consumer = {
            "mode": "cluster",
            "group": f"landing-{topic}",
            "client_id": name,
            "fetch_max_wait_ms": LONG_POLL_MS,
        }
        return Daemon(
            kafka_daemon_config(
                broker.bootstrap,
                tmp_path / name,
                topic=topic,
                consumer=consumer,
                landing_dir=landing,
                max_age=0.2,
            )
        )

    chunks: list[list[Produced]] = [
        [(i % partitions, None, b"%d" % i, []) for i in range(c * 2000, (c + 1) * 2000)] for c in range(4)
    ]
    a, b = member("a"), member("b")
    stop = asyncio.Event()
    run_a = asyncio.create_task(a.run(stop.wait()))
    run_b: asyncio.Task[None] | None = None
    revoked = stale("revoked")
    try:
        await asyncio.to_thread(produce, broker.bootstrap, chunks[0], topic=topic)
        await wait_until(lambda: a.stats["records_published"] == 2000, 30, "a landed the first chunk")
        await wait_until(lambda: in_flight(a), 10, "a long poll in flight")
        assert all(p.in_flight for p in a.consumer.snapshot().partitions)
        run_b = asyncio.create_task(b.run(stop.wait()))
        await asyncio.to_thread(produce, broker.bootstrap, chunks[1], topic=topic)
        await wait_until(
            lambda: 0 < len(b.consumer.assignment()) < partitions, 30, "the group split the partitions"
        )
        await wait_until(
            lambda: stale("revoked") > revoked,
            2 * LONG_POLL_MS / 1000 + 10,
            "the in-flight answer of a revoked partition dropped",
        )
        for chunk in chunks[2:]:
            await asyncio.to_thread(produce, broker.bootstrap, chunk, topic=topic)
        total = sum(len(c) for c in chunks)
        await wait_until(
            lambda: a.stats["records_published"] + b.stats["records_published"] >= total, 60, "all landed"
        )
    finally:
        stop.set()
        await asyncio.wait_for(run_a, 30)
        if run_b is not None:
            await asyncio.wait_for(run_b, 30)
    assert b.stats["records_published"] > 0, "b never landed anything"
    got = landed_rows(landing)
    for p in range(partitions):
        assert sorted(r[0] for r in got[p]) == list(range(2000)), f"partition {p}: lost or duplicated"
