"""Fetch v12 (KIP-320's diverging epoch in the fetch answer) and v13 (topics by topic id, KIP-516)
through the whole consumer engine against the scripted broker (tests/support/fake_kafka.py).

Tansu 0.6 advertises Fetch v0-v17 (so the source negotiates v13 with it, the highest it knows) but no
OffsetsForLeaderEpoch and one leader epoch: it never answers a diverging epoch, so that path runs here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from uuid import uuid4

import pytest
from support.consumer import new_consumer
from support.fake_kafka import TP0, FakeKafka, T, drain, kafka_config, values

from mqd.consumer import Consumer
from mqd.consumer.snapshot import PartitionSnapshot
from mqd.sources.kafka.log_incarnation import derived


@pytest.fixture
async def fake12() -> AsyncIterator[FakeKafka]:
    broker = await FakeKafka(T, 1, fetch_version=12).start()
    try:
        yield broker
    finally:
        await broker.stop()


def snap(c: Consumer) -> PartitionSnapshot:
    return next(p for p in c.snapshot().partitions if p.tp == TP0)


async def test_a_diverging_epoch_in_the_fetch_answer_is_a_truncation_at_once(
    fake12: FakeKafka, tmp_path: Path
) -> None:
    """Offsets 0-9 fetched in leader epoch 0; a new leader (epoch 1, not yet in any metadata the
    daemon read) kept 0-4 and wrote 5-14, longer than the position 10. The v12 Fetch at 10 carries
    last_fetched_epoch 0 and is answered with diverging_epoch (0, 5): the source makes it a new
    incarnation from 5 at once, with no OffsetsForLeaderEpoch round trip, and the new log's 5-14
    land as new records (t10.. of the new log are never taken for the old log's continuation)."""
    fake = fake12
    fake.logs[0] = [
        values(0, *[b"a%d" % i for i in range(5)]),
        values(5, *[b"a%d" % i for i in range(5, 10)]),
    ]
    async with new_consumer(kafka_config(fake, tmp_path, metadata_refresh_interval=600.0)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        fake.logs[0] = [fake.logs[0][0], values(5, *[b"t%d" % i for i in range(5, 15)], epoch=1)]
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        assert got[TP0] == [b"t%d" % i for i in range(5, 15)]
        assert fake.epoch_checks == []  # found in the fetch answer itself
        assert set(fake.fetch_versions) == {12}
        assert c.incarnations()[TP0] == derived(fake.topic_id, fake.topic_id, 0, 5)
        s = snap(c)
        assert (s.incarnation_changes, s.reused_offsets) == (1, 5)


async def test_a_leader_change_without_divergence_fetches_on(fake12: FakeKafka, tmp_path: Path) -> None:
    """The new leader (epoch 1) kept all of epoch 0 (0-9) and appended 10-11: the v12 Fetch at 10
    with last_fetched_epoch 0 gets records, no diverging epoch: same incarnation, nothing reused."""
    fake = fake12
    fake.logs[0] = [values(0, *[b"a%d" % i for i in range(10)])]
    async with new_consumer(kafka_config(fake, tmp_path, metadata_refresh_interval=600.0)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        fake.logs[0].append(values(10, b"b10", b"b11", epoch=1))
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 2)
        assert got[TP0] == [b"b10", b"b11"]
        assert c.incarnations()[TP0] == fake.topic_id
        s = snap(c)
        assert (s.incarnation_changes, s.reused_offsets) == (0, 0)


async def test_fetch_v13_by_topic_id_sees_a_recreate_before_any_metadata_refresh(tmp_path: Path) -> None:
    """Fetch v13 names the topic by id. The topic is deleted and recreated (a new id) with a log
    already longer than the position 5, and no metadata refresh is due: a fetch by name would read
    n5.. as the old log's continuation. By id the broker answers UNKNOWN_TOPIC_ID, the source reads
    the metadata again and answers INCARNATION_CHANGED at 0: all of the new topic's records land."""
    fake = await FakeKafka(T, 1, fetch_version=13).start()
    try:
        fake.logs[0] = [values(0, *[b"a%d" % i for i in range(5)])]
        async with new_consumer(kafka_config(fake, tmp_path, metadata_refresh_interval=600.0)) as c:
            await drain(c, lambda g: len(g.get(TP0, [])) == 5)
            old = fake.topic_id
            fake.topic_id = new = uuid4().hex
            fake.logs[0] = [values(0, *[b"n%d" % i for i in range(10)])]
            got = await drain(c, lambda g: len(g.get(TP0, [])) == 10)
            assert got[TP0] == [b"n%d" % i for i in range(10)]
            assert set(fake.fetch_versions) == {13}
            assert c.incarnations()[TP0] == new != old
            s = snap(c)
            assert (s.incarnation_changes, s.reused_offsets) == (1, 5)
    finally:
        await fake.stop()
