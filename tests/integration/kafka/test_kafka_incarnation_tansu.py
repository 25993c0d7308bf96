"""Kafka log incarnations against a real broker (Tansu and Apache Kafka on 127.0.0.1): Metadata v10
carries topic ids, so a topic deleted and recreated under a running daemon is a new incarnation.
(Tansu has no OffsetsForLeaderEpoch and one leader epoch: truncation is tested on the scripted
broker.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.kafka import Broker, kafka_daemon_config, landed_rows, produce

from mqd.consumer.source import FetchRequest, FetchStatus
from mqd.process.daemon import Daemon
from mqd.sources.kafka.source import KafkaSource
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")


async def test_a_recreated_topic_lands_as_new_records(
    broker: Broker, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """200 records land; the topic is deleted and recreated (a new topic id) and 40 records are
    produced into it: they land as new records under the new incarnation beside the old ones (none
    cut at the landed floor, no offset reset), and an error line names both incarnations."""
    broker.create_topic(topic, 2)
    produce(broker.bootstrap, [(i % 2, None, b"old-%d" % i, []) for i in range(200)], topic=topic)
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic, max_age=0.2))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 200, 30, "the first 200 landed")
        old = set(d.consumer.incarnations().values())
        await asyncio.to_thread(broker.delete_topic, topic)
        await asyncio.to_thread(broker.create_topic, topic, 2)
        await asyncio.to_thread(
            produce, broker.bootstrap, [(i % 2, None, b"new-%d" % i, []) for i in range(40)], topic=topic
        )
        await wait_until(lambda: d.stats["records_published"] == 240, 60, "the new records landed")
        new = set(d.consumer.incarnations().values())
        assert d.consumer.snapshot().totals.offset_resets == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert len(old) == len(new) == 1 and None not in old | new and old != new
    (old_id,), (new_id,) = old, new
    assert old_id is not None and new_id is not None
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(old_id in m and new_id in m for m in errors), errors
    got = landed_rows(tmp_path / "landing")
    incarnations = {
        (row["partition"], row["offset"], row["incarnation"])
        for path in (tmp_path / "landing").rglob("part-*.parquet")
        for row in pq.read_table(path, columns=["partition", "offset", "incarnation"]).to_pylist()
    }
    for p in (0, 1):
        assert sorted(r[0] for r in got[p] if r[2] and r[2].startswith(b"old-")) == list(range(100))
        assert sorted(r[0] for r in got[p] if r[2] and r[2].startswith(b"new-")) == list(range(20))
        assert {i for q, _o, i in incarnations if q == p} == {old_id, new_id}


async def test_tansu_is_fetched_by_topic_id(broker: Broker, topic: str, tmp_path: Path) -> None:
    """Tansu 0.6 advertises Fetch v0-v17, Kafka 4.4 v4-v18: the source negotiates v13 (the newest
    it has) and names the topic by its id (from Metadata v10); the answer maps back to the topic and
    its records decode, under the topic id as incarnation, each batch stamped with its leader epoch
    (0 on both: a new topic's first leader)."""
    broker.create_topic(topic, 1)
    produce(broker.bootstrap, [(0, None, b"v%d" % i, []) for i in range(3)], topic=topic)
    source = KafkaSource(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic).consumer)
    await source.start(timeout=15)
    try:
        tp = TopicPartition(topic, 0)
        assert source.cluster is not None
        node = source.cluster.partitions[tp].leader
        res = await source.fetch(
            node, [FetchRequest(tp, 0, 1 << 20)], max_wait_ms=100, min_bytes=1, max_bytes=1 << 20
        )
        (part,) = res.partitions
        decoded = part.decode(0, True)
        values = [v for b in decoded.batches for v in b.records.column("value").to_pylist()]
        assert source.fetch_version == 13
        assert part.status is FetchStatus.FOUND and values == [b"v0", b"v1", b"v2"]
        assert source.metadata is not None
        assert part.incarnation is not None and part.incarnation == source.metadata.topic_ids[topic]
        assert [b.leader_epoch for b in decoded.batches] == [0]
    finally:
        await source.stop()
