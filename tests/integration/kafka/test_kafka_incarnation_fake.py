"""Kafka log incarnations through the whole consumer engine against the scripted broker
(tests/support/fake_kafka.py): topic ids (Metadata v10) and truncation found with
OffsetsForLeaderEpoch, which Tansu does not serve."""

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
from mqd.waiting import wait_until

FENCED_LEADER_EPOCH = 74


@pytest.fixture
async def fake() -> AsyncIterator[FakeKafka]:
    broker = await FakeKafka(T, 1).start()
    try:
        yield broker
    finally:
        await broker.stop()


def snap(c: Consumer) -> PartitionSnapshot:
    return next(p for p in c.snapshot().partitions if p.tp == TP0)


async def test_the_topic_id_is_the_incarnation_and_a_recreated_topic_a_new_one(
    fake: FakeKafka, tmp_path: Path
) -> None:
    """The partition's incarnation is its topic id (Metadata v10). The topic deleted and recreated
    (a new id, a shorter log): INCARNATION_CHANGED with diverged_at 0, the 5 offsets fetched from
    the old topic are counted as reused, and the new topic's records are fetched from offset 0."""
    fake.logs[0] = [values(0, b"a0", b"a1", b"a2"), values(3, b"a3", b"a4")]
    old = fake.topic_id
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 5)
        assert c.incarnations()[TP0] == old
        fake.topic_id = new = uuid4().hex
        fake.logs[0] = [values(0, b"n0", b"n1")]
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 2)
        assert got[TP0] == [b"n0", b"n1"]
        assert c.incarnations()[TP0] == new
        s = snap(c)
        assert (s.incarnation_changes, s.reused_offsets) == (1, 5)


async def test_a_truncated_log_is_a_new_incarnation_from_the_epoch_end(
    fake: FakeKafka, tmp_path: Path
) -> None:
    """Offsets 0-9 fetched in leader epoch 0; a new leader (epoch 1) kept only 0-4 and wrote 5-7:
    the position 10 is beyond its end, so before that is treated as an offset out of range the
    source asks OffsetsForLeaderEpoch(0) -> 5 < 10: INCARNATION_CHANGED at 5, 5 offsets reused, the
    new log's 5-7 fetched under the derived incarnation."""
    fake.logs[0] = [
        values(0, *[b"a%d" % i for i in range(5)]),
        values(5, *[b"a%d" % i for i in range(5, 10)]),
    ]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        fake.logs[0] = [fake.logs[0][0], values(5, b"t5", b"t6", b"t7", epoch=1)]
        fake.leader_epoch[0] = 1
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 3)
        assert got[TP0] == [b"t5", b"t6", b"t7"]
        assert fake.epoch_checks and fake.epoch_checks[0] == {0: 0}
        assert c.incarnations()[TP0] == derived(fake.topic_id, fake.topic_id, 0, 5)
        s = snap(c)
        assert (s.incarnation_changes, s.reused_offsets) == (1, 5)


async def test_a_fenced_leader_epoch_checks_before_fetching_a_longer_new_log(
    fake: FakeKafka, tmp_path: Path
) -> None:
    """The new leader kept 0-4 and wrote 5-14 (longer than what we fetched): a Fetch at 10 would get
    other records, so it answers FENCED_LEADER_EPOCH; the source checks the epoch of position 10
    before fetching again and moves to 5 under a new incarnation."""
    fake.logs[0] = [
        values(0, *[b"a%d" % i for i in range(5)]),
        values(5, *[b"a%d" % i for i in range(5, 10)]),
    ]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        fake.errors[0] = FENCED_LEADER_EPOCH
        fake.logs[0] = [fake.logs[0][0], values(5, *[b"t%d" % i for i in range(5, 15)], epoch=1)]
        fake.leader_epoch[0] = 1
        await wait_until(lambda: snap(c).incarnation_changes == 1, 10, "incarnation change")
        fake.errors.pop(0)
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        assert got[TP0] == [b"t%d" % i for i in range(5, 15)]
        assert snap(c).reused_offsets == 5


async def test_a_leader_change_without_truncation_is_not_a_new_incarnation(
    fake: FakeKafka, tmp_path: Path
) -> None:
    """A new leader epoch in Metadata makes the source check the position's epoch: its end offset on
    the new leader (10) is not below the position (10), so nothing changes: same incarnation, no
    reuse, and the records the new leader appends are fetched."""
    fake.logs[0] = [values(0, *[b"a%d" % i for i in range(10)])]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 10)
        fake.leader_epoch[0] = 1
        await wait_until(lambda: bool(fake.epoch_checks), 10, "an epoch check after the metadata refresh")
        assert fake.epoch_checks[0] == {0: 0}
        fake.logs[0].append(values(10, b"b10", b"b11", epoch=1))
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 2)
        assert got[TP0] == [b"b10", b"b11"]
        assert c.incarnations()[TP0] == fake.topic_id
        s = snap(c)
        assert (s.incarnation_changes, s.reused_offsets) == (0, 0)


async def test_no_topic_ids_no_incarnation(tmp_path: Path) -> None:
    """A broker without Metadata v10 (no topic ids) and without OffsetsForLeaderEpoch: the
    incarnation stays None and records flow as before."""
    broker = await FakeKafka(T, 1, legacy=True).start()
    try:
        broker.logs[0] = [values(0, b"a", b"b")]
        async with new_consumer(kafka_config(broker, tmp_path)) as c:
            got = await drain(c, lambda g: len(g.get(TP0, [])) == 2)
            assert got[TP0] == [b"a", b"b"] and c.incarnations()[TP0] is None
    finally:
        await broker.stop()
