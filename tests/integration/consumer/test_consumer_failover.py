"""Master failure: the consumer continues from the slave without loss or duplicates, and returns to
the master when the slave suggests it; a lagging slave's answer never moves a position."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from support.consumer import collect, config, count_records, new_consumer, produce, records

from mqd import metrics
from mqd.consumer import TopicPartition
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

TPS = [TopicPartition("events", p) for p in range(2)]


async def test_master_killed_mid_stream_then_back(cluster_factory: Any) -> None:
    """Read part of the stream from the master, SIGKILL it, read the rest from the slave (every
    record exactly once, in order), restart the master: the slave sends the consumer back and new
    records come from the master."""
    cluster = cluster_factory(topics={"events": 2}, groups=1, slaves=1)
    master, slave = cluster.master(0), cluster.slaves(0)[0]
    async with BrokerClient(request_timeout=5) as client:
        for p in range(2):
            for lo in range(0, 300, 10):
                await produce(
                    client, cluster, p, [f"{p}:{i}".encode() for i in range(lo, lo + 10)], acks="all"
                )
        # small queues so most of the stream is still on the broker when the master dies; a session
        # that outlives the master's restart (3.3 s under a loaded CI run, the default 3 s here
        # expired and dropped the assignment): this test is about the pull node, not the session
        cfg = config(
            cluster,
            max_queued_records=40,
            partition_max_bytes=1024,
            fetch_max_wait_ms=200,
            session_timeout=30.0,
        )
        async with new_consumer(cfg, client=client) as consumer:
            assert {consumer.status()["assignment"][str(tp)]["pull_node"] for tp in TPS} == {master}
            got = await collect(consumer, lambda b: count_records(b) >= 60)
            cluster.kill(master, signal.SIGKILL)
            got += await collect(consumer, lambda b: count_records(got) + count_records(b) >= 600, timeout=15)
            by_tp = records(got)
            for tp in TPS:
                assert by_tp[tp] == [(i, f"{tp.partition}:{i}".encode()) for i in range(300)]
                assert consumer.status()["assignment"][str(tp)]["pull_node"] == slave
            cluster.start_node(master)
            await wait_until(
                lambda: all(
                    consumer.status()["assignment"].get(str(tp), {}).get("pull_node") == master for tp in TPS
                ),
                timeout=15,
                what="back on the master",
            )
            for tp in TPS:
                await produce(client, cluster, tp.partition, [b"after"])
            more = await collect(consumer, lambda b: count_records(b) >= 2)
            assert {tp: v for tp, v in records(more).items()} == {tp: [(300, b"after")] for tp in TPS}


async def test_lagging_slave_answer_is_not_a_reset(cluster_factory: Any) -> None:
    """With the master down, a slave answers an offset beyond its log with OFFSET_OVERFLOW_BADLY
    keeping the requested offset: the position stays, nothing is counted as a reset, and the
    records arrive once they exist."""
    cluster = cluster_factory(topics={"events": 1}, groups=1, slaves=1)
    tp = TPS[0]
    master = cluster.master(0)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"a", b"b"], acks="all")
        cluster.kill(master, signal.SIGKILL)

        async def hook(_: TopicPartition) -> int:
            return 5  # beyond the slave's log end (2)

        labels = {"topic": "events", "partition": "0", "status": "OFFSET_OVERFLOW_BADLY"}
        before = metrics.REGISTRY.get_sample_value("mqd_offset_resets_total", labels) or 0.0
        bootstrap = list(cluster.urls.values())  # the first one is down
        async with new_consumer(
            config(cluster, bootstrap=bootstrap), client=client, start_position=hook
        ) as consumer:
            # the slave takes over as coordinator once it notices the master is gone
            await wait_until(lambda: tp in consumer.assignment(), 10.0, what="assignment")
            await wait_until(
                lambda: consumer.status()["assignment"][str(tp)]["log_end"] == 2, 10.0, what="answer"
            )
            await wait_until(lambda: consumer.status()["nodes"][cluster.slaves(0)[0]]["requests"] >= 3, 10.0)
            assert consumer.positions() == {tp: 5}
            assert consumer.fetched_batches() == []
            after = metrics.REGISTRY.get_sample_value("mqd_offset_resets_total", labels) or 0.0
            assert after == before
            assert consumer.status()["assignment"][str(tp)]["parked"] is None


async def test_dead_cluster_backs_off_then_recovers(cluster_factory: Any) -> None:
    """With the only node down the fetcher backs off (capped exponential, no tight loop) and keeps
    its position; once the node is back, fetching resumes where it stopped."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    tp = TPS[0]
    node = cluster.master(0)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"a"])
        async with new_consumer(
            config(cluster, error_backoff_max_ms=400, session_timeout=60), client=client
        ) as consumer:
            got = await collect(consumer, lambda b: count_records(b) >= 1)
            assert records(got)[tp] == [(0, b"a")]
            cluster.kill(node, signal.SIGKILL)
            await wait_until(lambda: consumer.status()["nodes"][node]["errors"] >= 3, 10.0, what="errors")
            first = consumer.status()["nodes"][node]["errors"]
            await wait_until(
                lambda: consumer.status()["nodes"][node]["backoff_s"] > 0.15, 10.0, what="backoff grows"
            )
            # with a 400 ms cap, one second of outage costs a handful of attempts, not hundreds
            errors_before = consumer.status()["nodes"][node]["errors"]
            await asyncio.sleep(1.0)
            assert consumer.status()["nodes"][node]["errors"] - errors_before <= 6
            assert first >= 3 and consumer.positions() == {tp: 1}
            cluster.start_node(node)
            await produce(client, cluster, 0, [b"b"])
            got = await collect(consumer, lambda b: count_records(b) >= 1, timeout=15)
            assert records(got)[tp] == [(1, b"b")]


async def test_expired_session_releases_partitions_until_rejoined(cluster_factory: Any) -> None:
    """When no heartbeat is answered for a whole session timeout, the consumer gives its partitions
    up (the group has dropped it; others may own them now) and takes them back after rejoining."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    node = cluster.master(0)
    revoked: list[set[TopicPartition]] = []

    class Listener:
        def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
            revoked.append(tps)

        def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
            pass

    async with BrokerClient(request_timeout=5) as client:
        cfg = config(cluster, session_timeout=1.0)
        async with new_consumer(cfg, client=client, listener=Listener()) as consumer:
            assert consumer.assignment() == set(TPS)
            cluster.kill(node, signal.SIGKILL)
            await wait_until(lambda: not consumer.assignment(), 10.0, what="partitions released")
            assert revoked == [set(TPS)]
            cluster.start_node(node)
            await wait_until(lambda: consumer.assignment() == set(TPS), timeout=15, what="rejoined")


async def test_far_behind_reads_from_slave_then_back_to_master(cluster_factory: Any) -> None:
    """A consumer far behind the head is sent to the slave by the master (cold read), and back to
    the master by the slave once it has caught up; every record arrives once across the moves."""
    cluster = cluster_factory(
        topics={"events": 1}, groups=1, slaves=1, node_settings={"slave_suggest_lag_bytes": 4000}
    )
    master, slave = cluster.master(0), cluster.slaves(0)[0]
    tp = TPS[0]
    async with BrokerClient(request_timeout=5) as client:
        for lo in range(0, 400, 10):
            await produce(client, cluster, 0, [f"0:{i}".encode() for i in range(lo, lo + 10)], acks="all")
        cfg = config(cluster, partition_max_bytes=1024, max_queued_records=30)
        async with new_consumer(cfg, client=client) as consumer:
            seen_nodes: set[str] = set()
            got: list[Any] = []
            for _ in range(2000):
                seen_nodes.add(consumer.status()["assignment"][str(tp)]["pull_node"])
                got += consumer.fetched_batches()
                if count_records(got) >= 400:
                    break
                await consumer.wait_for_data(0.05)
            assert records(got)[tp] == [(i, f"0:{i}".encode()) for i in range(400)]
            assert slave in seen_nodes
            await wait_until(
                lambda: consumer.status()["assignment"][str(tp)]["pull_node"] == master,
                10.0,
                what="back on master",
            )
