"""A topic deleted and recreated while no daemon runs, on Tansu and on Apache Kafka (the ``broker``
fixture): the landing's head names the old topic id as its incarnation, the broker's metadata the new
one. (Recreated under a running daemon: test_kafka_incarnation_tansu.py, both brokers too.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.kafka import Broker, Produced, kafka_daemon_config, produce

from mqd.process.daemon import Daemon

pytest.importorskip("confluent_kafka")


def landed(landing: Path) -> list[tuple[int, int, bytes, str]]:
    """(partition, offset, value, incarnation) of every landed record."""
    return [
        (row["partition"], row["offset"], row["value"], row["incarnation"])
        for path in landing.rglob("part-*.parquet")
        for row in pq.read_table(path, columns=["partition", "offset", "value", "incarnation"]).to_pylist()
    ]


async def test_a_topic_recreated_while_the_daemon_was_stopped_lands_whole_as_a_new_incarnation(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """100 records per partition land and the daemon stops. The topic is deleted and recreated (a new
    topic id) and filled again: partition 0 with 30 records (its log ends below the landed end),
    partition 1 with 150 (its offsets 0-99 are the landed ones again, 100-149 beyond). The next
    daemon resumes at offset 100 of the old incarnation: the new id makes each partition a new
    incarnation diverged at 0 (100 reused offsets each, counted), and every record of the new logs
    lands, none skipped as already landed, none cut, no offset reset; the old rows stay as they were."""
    await asyncio.to_thread(broker.create_topic, topic, 2)
    old: list[Produced] = [(i % 2, None, b"old-%d" % i, []) for i in range(200)]
    await asyncio.to_thread(produce, broker.bootstrap, old, topic=topic)
    config = kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic)
    first = Daemon(config, burst=True)
    await asyncio.wait_for(first.run(), 60)
    assert first.stats["records_published"] == 200
    before = landed(tmp_path / "landing")
    (old_id,) = {inc for *_rest, inc in before}

    await asyncio.to_thread(broker.delete_topic, topic)
    await asyncio.to_thread(broker.create_topic, topic, 2)
    new: list[Produced] = [(0, None, b"new0-%d" % i, []) for i in range(30)]
    new += [(1, None, b"new1-%d" % i, []) for i in range(150)]
    await asyncio.to_thread(produce, broker.bootstrap, new, topic=topic)

    second = Daemon(config, burst=True)
    await asyncio.wait_for(second.run(), 60)
    totals = second.consumer.snapshot().totals
    assert second.stats["records_published"] == 180 and second.stats["records_cut"] == 0
    assert (totals.incarnation_changes, totals.reused_offsets, totals.offset_resets) == (2, 200, 0)

    rows = landed(tmp_path / "landing")
    assert sorted(r for r in rows if r[3] == old_id) == sorted(before)
    fresh = [r for r in rows if r[3] != old_id]
    assert len({inc for *_rest, inc in fresh}) == 1
    for p, count in ((0, 30), (1, 150)):
        got = sorted((o, v) for q, o, v, _inc in fresh if q == p)
        assert got == [(i, b"new%d-%d" % (p, i)) for i in range(count)], f"partition {p}"
