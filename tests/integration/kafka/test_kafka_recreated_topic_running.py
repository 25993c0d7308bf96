"""A topic deleted and recreated with another partition count while the daemon runs, on Tansu and
Apache Kafka (the ``broker`` fixture; both give the recreated topic a new id in Metadata v10 and
behave alike here). The stopped case is test_kafka_recreated_topic.py; the same partition count
under a running daemon is test_kafka_incarnation_tansu.py. The second test: the landed and committed
offsets follow the recreated topic (they kept the old log's end before the offset store's rewind)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.kafka import Broker, Produced, kafka_daemon_config, produce

from mqd.process.daemon import Daemon
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")


def landed(landing: Path) -> list[tuple[int, int, bytes, str]]:
    """(partition, offset, value, incarnation) of every landed record."""
    return [
        (row["partition"], row["offset"], row["value"], row["incarnation"])
        for path in landing.rglob("part-*.parquet")
        for row in pq.read_table(path, columns=["partition", "offset", "value", "incarnation"]).to_pylist()
    ]


def group_committed(bootstrap: str, group: str, topic: str) -> int:
    """The group's committed offset of ``topic``'s partition 0 on the broker (OffsetFetch; -1001:
    none). Blocking."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as KafkaPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (tp,) = c.committed([KafkaPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def assignment(d: Daemon, topic: str) -> dict[int, dict[str, Any]]:
    """The status's assignment entries of ``topic`` by partition (none before the daemon runs)."""
    entries = (d.status()["consumer"] or {}).get("assignment", {}).values()
    return {e["partition"]: e for e in entries if e["topic"] == topic}


async def test_a_topic_recreated_with_more_partitions_under_a_running_daemon(
    broker: Broker, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """100 records per partition of a 2-partition topic land; with the daemon running the topic is
    deleted and recreated with 3 partitions (a new topic id) and filled at once: partition 0 with 30
    records (its log ends below the landed 100), partition 1 with 150 (offsets 0-99 are the landed
    ones again), the new partition 2 with 40. The daemon notices the new id: partitions 0 and 1 are
    a new incarnation diverged at 0 (100 reused offsets each, counted, an error line naming both
    ids), partition 2 is new (no change to count). All 220 new records land under the new
    incarnation, none skipped as already landed, none twice, no offset reset, nothing cut; the old
    rows stay as they were; every partition shows its new log's landed offset in the status
    (partition 0's moved back from the old log's 100 to the new log's 30)."""
    await asyncio.to_thread(broker.create_topic, topic, 2)
    old: list[Produced] = [(i % 2, None, b"old-%d" % i, []) for i in range(200)]
    await asyncio.to_thread(produce, broker.bootstrap, old, topic=topic)
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic, max_age=0.2))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 200, 30, "the first 200 landed")
        (old_id,) = set(d.consumer.incarnations().values())
        assert old_id is not None

        await asyncio.to_thread(broker.delete_topic, topic)
        await asyncio.to_thread(broker.create_topic, topic, 3)
        new: list[Produced] = [(0, None, b"new0-%d" % i, []) for i in range(30)]
        new += [(1, None, b"new1-%d" % i, []) for i in range(150)]
        new += [(2, None, b"new2-%d" % i, []) for i in range(40)]
        await asyncio.to_thread(produce, broker.bootstrap, new, topic=topic)
        await wait_until(lambda: d.stats["records_published"] == 420, 60, "the new records landed")
        counts = {0: 30, 1: 150, 2: 40}
        await wait_until(
            lambda: (
                {p: (e["landed"], e["log_end"]) for p, e in assignment(d, topic).items()}
                == {p: (n, n) for p, n in counts.items()}
            ),
            30,
            "the status's landed offsets and log ends at the new logs' ends",
        )
        assert assignment(d, topic)[0]["position"] == 30
        totals = d.consumer.snapshot().totals
        assert (totals.incarnation_changes, totals.reused_offsets, totals.offset_resets) == (2, 200, 0)
        assert d.stats["records_cut"] == 0
        incs = d.consumer.incarnations()
        new_ids = {incs[TopicPartition(topic, p)] for p in range(3)}
        assert len(new_ids) == 1 and old_id not in new_ids and None not in new_ids
        (new_id,) = new_ids
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(old_id in m and str(new_id) in m for m in errors), errors

    rows = landed(tmp_path / "landing")
    assert sorted((p, o) for p, o, _v, inc in rows if inc == old_id) == sorted(
        (p, o) for p in (0, 1) for o in range(100)
    )
    fresh = [r for r in rows if r[3] == new_id]
    assert len(fresh) + 200 == len(rows)
    for p, count in counts.items():
        got = sorted((o, v) for q, o, v, _inc in fresh if q == p)
        assert got == [(i, b"new%d-%d" % (p, i)) for i in range(count)], f"partition {p}"


async def test_the_landed_and_committed_offsets_follow_the_recreated_topic(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A daemon in a consumer group lands 40 records of a 1-partition topic and commits 40; the topic
    is recreated under it and 10 records produced: they land (new incarnation), and the status's
    landed and committed offsets are the new log's 10, so its lag is the new log's (0), not taken
    against the old log's end; the broker holds the group's committed offset 10 after the stop.

    Found writing the test above (both brokers), fixed by ``OffsetStore.rewind``: they stayed 40
    beside a log end of 10, so the lag read 0 whatever the new log held up to offset 40, and a
    partition whose new log is longer showed too little lag until its landings passed the old end.
    Apache Kafka drops the group's offsets with the deleted topic, and the daemon committed nothing
    for the new one (its mark, 40, was not ahead of what it persisted): a describe of the group
    showed no committed offset while ``mqd status`` said committed 40. Cause: the offset store's
    marks and persisted copies only moved forward, and ``_incarnation_changed`` moved the position
    to the divergence point but not the mark. No record was lost: a restart starts from the
    landing's head of the new incarnation."""
    await asyncio.to_thread(broker.create_topic, topic, 1)
    await asyncio.to_thread(
        produce, broker.bootstrap, [(0, None, b"old-%d" % i, []) for i in range(40)], topic=topic
    )
    consumer = {"mode": "cluster", "group": f"landing-{topic}"}
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic, consumer=consumer, max_age=0.2))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(
            lambda: assignment(d, topic).get(0, {}).get("committed") == 40,
            30,
            "the first 40 landed and committed",
        )
        await asyncio.to_thread(broker.delete_topic, topic)
        await asyncio.to_thread(broker.create_topic, topic, 1)
        await asyncio.to_thread(
            produce, broker.bootstrap, [(0, None, b"new-%d" % i, []) for i in range(10)], topic=topic
        )
        await wait_until(lambda: d.stats["records_published"] == 50, 30, "the new records landed")
        await wait_until(lambda: assignment(d, topic)[0]["log_end"] == 10, 10, "the new log end polled")
        await wait_until(
            lambda: assignment(d, topic)[0]["committed"] == 10, 30, "the new log's landed end committed"
        )
        part = assignment(d, topic)[0]
        assert (part["landed"], part["committed"], part["lag"]) == (10, 10, 0), part
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert await asyncio.to_thread(group_committed, broker.bootstrap, consumer["group"], topic) == 10
