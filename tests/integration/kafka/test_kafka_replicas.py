"""Replicas on three real Apache Kafka brokers: follower fetching (KIP-392, consumer.kafka.client_rack)
and a partition moved to other brokers (reassignment) while a daemon reads under load. Where reads
went is what mqd's Kafka source counts per node and partition (``served_bytes``: the record bytes
each broker's answers carried), beside the engine's pull node."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce
from support.kafka_admin import java_can_run_sources, reassign_partition

from mqd.consumer.source import FetchRequest, FetchStatus, PartitionResult
from mqd.process.daemon import Daemon
from mqd.sources.kafka.source import KafkaSource
from mqd.testing import KafkaCluster
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_until, wait_until_sync

pytest.importorskip("confluent_kafka")

RACK_AWARE = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def source_of(d: Daemon) -> KafkaSource:
    return cast(KafkaSource, d.consumer._source)


def served(d: Daemon, node: str, tp: TopicPartition) -> int:
    return source_of(d).served_bytes.get((node, tp), 0)


def pull_node(d: Daemon, tp: TopicPartition) -> str | None:
    return next((p.pull_node for p in d.consumer.snapshot().partitions if p.tp == tp), None)


class Stream:
    """Records produced in chunks while the daemon reads: each chunk waits (bounded) until the
    daemon landed all but ``ahead`` of what came before, so the daemon stays mid-stream however
    fast either side is. Values are ``<tag><n>``, unique."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, landed: Callable[[], int]) -> None:
        self.bootstrap, self.topic, self.partitions, self.landed = bootstrap, topic, partitions, landed
        self.produced = 0
        self.values: list[bytes] = []

    async def run(self, tag: bytes, chunks: int, per_chunk: int, ahead: int) -> None:
        for c in range(chunks):
            await wait_until(lambda: self.landed() >= self.produced - ahead, 60, "the daemon to keep up")
            values = [b"%s%d" % (tag, c * per_chunk + i) for i in range(per_chunk)]
            records: list[Produced] = [(i % self.partitions, None, v, []) for i, v in enumerate(values)]
            await asyncio.to_thread(produce, self.bootstrap, records, topic=self.topic)
            self.values.extend(values)
            self.produced += per_chunk


def assert_landed_once(landing: Path, partitions: int, values: list[bytes]) -> None:
    got = landed_rows(landing)
    rows = [r for p in range(partitions) for r in got[p]]
    for p in range(partitions):
        offsets = sorted(r[0] for r in got[p])
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets lost or duplicated"
    assert len(rows) == len(values) and {r[2] for r in rows} == set(values)


async def _create(cluster: KafkaCluster, topic: str, assignment: list[list[int]]) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    new = NewTopic(topic, len(assignment), replica_assignment=assignment)
    for fut in cluster.admin().create_topics([new]).values():
        await asyncio.to_thread(fut.result, 30)
    for p, replicas in enumerate(assignment):
        await asyncio.to_thread(
            wait_until_sync,
            lambda p=p, r=sorted(replicas): cluster.in_sync_replicas(topic, p, 1.0) == r,
            30,
            f"partition {p}'s replicas in sync",
        )


@pytest.mark.slow
async def test_a_follower_in_the_clients_rack_serves_its_reads_and_the_leader_takes_over_when_it_dies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Brokers in racks r0, r1, r2 with Kafka's RackAwareReplicaSelector; one partition on all three,
    led by broker 0. A daemon with client_rack = r1 sends it as Fetch's rack_id: the leader names
    broker 1, and every record byte of the first 1,000 records comes from broker 1, none from the
    leader (its answers naming the replica carry no records), while the lease
    (metadata_refresh_interval, 1 s here) is renewed by the leader again and again, and the log end
    is asked of the leader all along. Then broker 1 is SIGKILLed mid-stream: the partition goes back
    to the leader (a log line says so), which serves the rest; every record of the 3,000 lands
    exactly once, no offset reset."""
    cluster = KafkaCluster(
        tmp_path / "kafka",
        3,
        settings={"replica.selector.class": RACK_AWARE},
        broker_settings={i: {"broker.rack": f"r{i}"} for i in range(3)},
    )
    await asyncio.to_thread(cluster.start)
    tp = TopicPartition("near", 0)
    stop = asyncio.Event()
    run: asyncio.Task[None] | None = None
    try:
        await _create(cluster, "near", [[0, 1, 2]])
        config = kafka_daemon_config(
            cluster.bootstrap,
            tmp_path / "d",
            topic="near",
            consumer={"kafka": {"client_rack": "r1"}, "log_end_interval": 0.3},
            max_age=0.2,
        )
        d = Daemon(config)
        run = asyncio.create_task(d.run(stop.wait()))
        stream = Stream(cluster.bootstrap, "near", 1, lambda: d.stats["records_published"])
        await stream.run(b"a", 10, 100, 300)
        await wait_until(lambda: d.stats["records_published"] == 1000, 60, "the first 1000 landed")
        # idle, the partition still goes back to the leader at each lease end, which names broker 1 again
        replicas = source_of(d).read_replicas
        await wait_until(lambda: replicas.named_count >= 3, 30, "the lease renewed twice")
        assert served(d, "1", tp) > 0 and served(d, "0", tp) == served(d, "2", tp) == 0
        # at each lease end the partition is on the leader until its answer names broker 1 again
        await wait_until(lambda: pull_node(d, tp) == "1", 10, "back on broker 1 after the renewal")
        # the log end is asked of the leader: broker 1, a follower, answers NOT_LEADER_OR_FOLLOWER
        assert not [r.getMessage() for r in caplog.records if "log-end lookup failed" in r.getMessage()]

        producing = asyncio.create_task(stream.run(b"b", 20, 100, 300))
        await wait_until(lambda: d.stats["records_published"] >= 1500, 60, "mid-stream")
        await asyncio.to_thread(cluster.kill_broker, 1)
        await asyncio.wait_for(producing, 120)
        await wait_until(lambda: d.stats["records_published"] == 3000, 60, "all 3000 landed")
        assert served(d, "0", tp) > 0 and pull_node(d, tp) == "0"
        assert d.consumer.snapshot().totals.offset_resets == 0
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        stop.set()
        if run is not None:
            await asyncio.wait_for(run, 30)
        await asyncio.to_thread(cluster.stop)
    assert_landed_once(tmp_path / "d" / "landing", 1, stream.values)
    back = [r.getMessage() for r in caplog.records if "preferred read replica failed" in r.getMessage()]
    assert back and "replica='1'" in back[0], back


@pytest.mark.slow
@pytest.mark.skipif(not java_can_run_sources(), reason="needs a JDK (java and javac) for Kafka's Admin")
async def test_a_partition_moved_to_another_broker_under_load_lands_once_and_is_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0 lives on broker 0 alone, partition 1 on broker 1. While a daemon lands a stream of
    records, Kafka's Admin.alterPartitionReassignments moves partition 0 to broker 2: broker 2 copies
    the log, joins the ISR and leads; broker 0 drops it. The daemon follows the leader to broker 2
    (its fetches from broker 0 answered NOT_LEADER_OR_FOLLOWER, the metadata re-read): broker 2
    serves the records produced after the move, and every record, before, during and after the
    move, lands exactly once, no offset reset."""
    caplog.set_level(logging.INFO, logger="mqd.consumer.fetcher")
    cluster = KafkaCluster(tmp_path / "kafka", 3)
    await asyncio.to_thread(cluster.start)
    tp0 = TopicPartition("moved", 0)
    stop = asyncio.Event()
    run: asyncio.Task[None] | None = None
    try:
        await _create(cluster, "moved", [[0], [1]])
        config = kafka_daemon_config(cluster.bootstrap, tmp_path / "d", topic="moved", max_age=0.2)
        d = Daemon(config)
        run = asyncio.create_task(d.run(stop.wait()))
        stream = Stream(cluster.bootstrap, "moved", 2, lambda: d.stats["records_published"])
        await stream.run(b"a", 20, 200, 1000)
        await wait_until(lambda: d.stats["records_published"] == 4000, 60, "the first 4000 landed")
        assert served(d, "0", tp0) > 0 and served(d, "2", tp0) == 0

        producing = asyncio.create_task(stream.run(b"b", 30, 200, 600))
        await wait_until(lambda: d.stats["records_published"] >= 5000, 60, "mid-stream")
        await asyncio.to_thread(reassign_partition, cluster.bootstrap, "moved", 0, [2], tmp_path / "java")

        def moved() -> bool:
            md: Any = cluster._metadata("moved", 1.0)
            p = None if md is None else md.topics["moved"].partitions.get(0)
            return p is not None and p.leader == 2 and list(p.replicas) == [2]

        await asyncio.to_thread(wait_until_sync, moved, 60, "partition 0 on broker 2 alone")
        await asyncio.wait_for(producing, 120)
        await stream.run(b"c", 10, 200, 600)  # after the move: only broker 2 has partition 0
        total = len(stream.values)
        await wait_until(lambda: d.stats["records_published"] == total, 60, "every record landed")
        assert served(d, "2", tp0) > 0 and pull_node(d, tp0) == "2"
        assert d.consumer.snapshot().totals.offset_resets == 0
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        stop.set()
        if run is not None:
            await asyncio.wait_for(run, 30)
        await asyncio.to_thread(cluster.stop)
    assert_landed_once(tmp_path / "d" / "landing", 2, stream.values)
    switched = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pull node switched")]
    assert any("from_node='0'" in m and "to_node='2'" in m and "partition=0" in m for m in switched), switched


@pytest.mark.slow
async def test_the_source_reads_a_follower_as_a_kafka_consumer_does(tmp_path: Path) -> None:
    """The Kafka source alone on racks r0-r2 (RackAwareReplicaSelector), a partition led by broker 0
    and replicated on 1 and 2. With rack r1, the leader answers a fetch with no records and names
    broker 1 (the suggested node); without a rack it serves the records itself. Broker 1 serves them
    under the lease. An epoch check due while reading from broker 1 is asked of the leader (a
    follower answers a consumer's OffsetsForLeaderEpoch NOT_LEADER_OR_FOLLOWER, which would stall
    the partition) and the fetch goes on. A position beyond broker 1's log is NOT_SERVED, so the
    engine asks the leader: no bounds lookup, no offset reset on a replica's word; the lease ends."""
    cluster = KafkaCluster(
        tmp_path / "kafka",
        3,
        settings={"replica.selector.class": RACK_AWARE},
        broker_settings={i: {"broker.rack": f"r{i}"} for i in range(3)},
    )
    await asyncio.to_thread(cluster.start)
    tp = TopicPartition("near", 0)
    sources: list[KafkaSource] = []

    async def fetch(src: KafkaSource, node: str, offset: int) -> PartitionResult:
        res = await src.fetch(
            node, [FetchRequest(tp, offset, 1 << 20)], max_wait_ms=100, min_bytes=1, max_bytes=1 << 20
        )
        (part,) = res.partitions
        return part

    def values(part: PartitionResult, offset: int) -> list[bytes]:
        decoded = part.decode(offset, True)
        return [v for b in decoded.batches for v in b.records.column("value").to_pylist()]

    try:
        await _create(cluster, "near", [[0, 1, 2]])
        records: list[Produced] = [(0, None, b"v%d" % i, []) for i in range(10)]
        await asyncio.to_thread(produce, cluster.bootstrap, records, topic="near")
        for rack in ("r1", ""):
            conf = kafka_daemon_config(
                cluster.bootstrap, tmp_path, topic="near", consumer={"kafka": {"client_rack": rack}}
            )
            sources.append(KafkaSource(conf.consumer))
            await sources[-1].start(timeout=15)
        near, plain = sources

        part = await fetch(plain, "0", 0)
        assert part.status is FetchStatus.FOUND and part.suggested_node is None
        assert values(part, 0) == [b"v%d" % i for i in range(10)]

        part = await fetch(near, "0", 0)
        assert part.status is FetchStatus.CAUGHT_UP and part.suggested_node == "1"
        assert near.served_bytes.get(("0", tp), 0) == 0 and near.read_replicas.replica(tp) == "1"

        async def follower_serves() -> PartitionResult | None:
            found = await fetch(near, "1", 0)  # its high watermark may trail the leader's a moment
            return found if found.status is FetchStatus.FOUND else None

        part = await wait_until(follower_serves, 30, "broker 1 to serve the records")
        assert part.suggested_node is None and values(part, 0) == [b"v%d" % i for i in range(10)]

        near.incarnations.pending.add(tp)  # as after a higher leader epoch in the metadata
        checks = near.epoch_checks
        part = await fetch(near, "1", 5)
        assert part.status is FetchStatus.FOUND, part.error
        assert near.epoch_checks == checks + 1 and values(part, 5) == [b"v%d" % i for i in range(5, 10)]

        # no epoch for the position: else the broker's diverging-epoch answer (epoch 0 ends at 10)
        # would rightly come first, as a truncation
        near.incarnations.forget_epochs(tp)
        part = await fetch(near, "1", 1000)
        assert part.status is FetchStatus.NOT_SERVED and "asking the leader" in (part.error or "")
        assert near.read_replicas.replica(tp) is None and near.read_replicas.ended == 1
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        for src in sources:
            await src.stop()
        await asyncio.to_thread(cluster.stop)
