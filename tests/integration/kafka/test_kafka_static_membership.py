"""KIP-345 static membership on the wire, against the scripted broker (tests/support/fake_kafka.py):
Tansu cannot show fencing, since it hands a second process with the same group_instance_id the
first one's member id and both then own the share (the restart path runs on Tansu in
test_kafka_group.py).

Proves that a member with static_membership names its group_instance_id in JoinGroup and does not
leave when it stops (its restart takes its place back), while a member without it (named or not)
sends no instance id and leaves; and that a
FENCED_INSTANCE_ID answer makes the member stop rejoining and own nothing, with an error naming the
instance id, where it used to rejoin at once and fence the other process in turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.fake_kafka import HEARTBEAT, FakeKafka
from support.kafka import kafka_daemon_config

from mqd.consumer.source import GroupSettings
from mqd.sources.kafka.group import KafkaGroup
from mqd.sources.kafka.source import KafkaSource
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_until

FENCED_INSTANCE_ID = 82
PARTS = [TopicPartition("events", 0), TopicPartition("events", 1)]


@pytest.fixture
async def broker() -> AsyncIterator[FakeKafka]:
    fake = await FakeKafka("events", 2, groups=True).start()
    yield fake
    await fake.stop()


async def joined(
    broker: FakeKafka, tmp_path: Path, instance: str, static: bool = True
) -> tuple[KafkaSource, KafkaGroup]:
    cfg = kafka_daemon_config(broker.bootstrap, tmp_path, consumer={"mode": "cluster", "group": "g"}).consumer
    source = KafkaSource(cfg)
    await source.start(timeout=10)
    settings = GroupSettings("g", "client", ("events",), "averagely", 0.1, 10.0, 2.0)
    group = KafkaGroup(
        client=lambda: source._client,
        cluster=lambda: source.cluster,
        settings=settings,
        on_change=lambda: None,
        instance_id=instance or None,
        error_backoff=0.05,
        static=static,
    )
    await group.start()
    await wait_until(lambda: group.assignment(PARTS) is not None, 10, "joined")
    return source, group


async def test_a_static_member_names_itself_and_does_not_leave(broker: FakeKafka, tmp_path: Path) -> None:
    source, group = await joined(broker, tmp_path / "static", "host-1")
    try:
        got = group.assignment(PARTS)
        assert got is not None and got.partitions == frozenset(PARTS)
        assert broker.joins[0] == ("", "host-1")
        await group.stop()
        assert broker.leaves == []
    finally:
        await source.stop()

    leaves = 0
    for name, instance in (("dynamic", ""), ("named", "host-2")):  # a name without static_membership
        source, group = await joined(broker, tmp_path / name, instance, static=False)
        try:
            member = group.member_id
            await group.stop()
            leaves += 1
            assert broker.joins[-1] == ("", None) and broker.leaves[-1] == member
            assert len(broker.leaves) == leaves
        finally:
            await source.stop()


async def test_a_fenced_member_owns_nothing_and_stops_rejoining(broker: FakeKafka, tmp_path: Path) -> None:
    source, group = await joined(broker, tmp_path, "host-1")
    try:
        joins = len(broker.joins)
        broker.group_errors[HEARTBEAT] = FENCED_INSTANCE_ID
        await wait_until(lambda: group.fenced, 10, "the member fenced")
        got = group.assignment(PARTS)
        assert got is not None and got.partitions == frozenset()
        assert "group_instance_id 'host-1'" in (group.last_error or "")
        assert group._task is not None
        await wait_until(group._task.done, 10, "the group loop ended")
        assert len(broker.joins) == joins
    finally:
        await group.stop()
        await source.stop()
    assert not group.fenced  # a stop clears it: a restart with its own id joins again
