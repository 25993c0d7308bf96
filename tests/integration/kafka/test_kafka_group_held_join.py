"""A Kafka group member waits for a JoinGroup as long as the coordinator may hold it (issue 14).

Tansu holds a JoinGroup for half the group's session, the session the group was formed with: a
member with a shorter session of its own (here 3 s, so its requests were given up after
request_timeout + session_timeout = 4 s) joining a group formed with 10 s (held 5 s) never joined,
each attempt given up while Tansu still held it and the next one queued behind it on the same
connection. Kafka itself holds a JoinGroup up to the group's rebalance timeout, the largest of its
members'."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka.client import AIOKafkaClient
from support.kafka import Broker

from mqd.consumer.source import GroupSettings
from mqd.sources.kafka.group import KafkaGroup
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")


def settings(session_timeout: float, topic: str) -> GroupSettings:
    return GroupSettings(
        group=f"g-{topic}",
        member_id="unused",
        topics=(topic,),
        allocation="averagely",
        heartbeat_interval=0.5,
        session_timeout=session_timeout,
        request_timeout=1.0,
    )


@pytest.fixture
async def clients(broker: Broker, topic: str) -> AsyncIterator[Callable[[], AIOKafkaClient]]:
    """A new client per member: Tansu serves a connection one request at a time."""
    broker.create_topic(topic, 2)
    made: list[AIOKafkaClient] = []

    def new() -> AIOKafkaClient:
        c = AIOKafkaClient(bootstrap_servers=broker.bootstrap.split(","), request_timeout_ms=30_000)
        made.append(c)
        return c

    try:
        yield new
    finally:
        for c in made:
            await c.close()


async def test_joins_a_group_whose_coordinator_holds_joins_past_its_own_session(
    clients: Callable[[], AIOKafkaClient], topic: str
) -> None:
    """A member with a 3 s session joins a group formed with a 10 s one (Tansu holds its JoinGroup
    5 s, Kafka until the group's rebalance timeout): both end in one generation."""

    async def member(name: str, session: float) -> KafkaGroup:
        client = clients()
        await client.bootstrap()
        return KafkaGroup(
            client=lambda: client,
            cluster=lambda: None,
            settings=settings(session, topic),
            on_change=lambda: None,
            instance_id=name,
            error_backoff=0.1,
        )

    a, b = await member("a", 10.0), await member("b", 3.0)
    try:
        await a.start()  # forms the group with its 10 s session: Tansu holds every JoinGroup 5 s
        await wait_until(lambda: a.generation is not None, 30, "a to form the group")
        await b.start()
        await wait_until(
            lambda: b.generation is not None and a.generation == b.generation and a.members == ("a", "b"),
            40,
            "b (3 s session) to join a's group",
        )
    finally:
        await b.stop()
        await a.stop()


async def test_the_other_member_joins_when_the_leader_stops_while_the_group_forms(
    clients: Callable[[], AIOKafkaClient], topic: str
) -> None:
    """Tansu keeps a leader that sends LeaveGroup while the group re-forms as the leader, and no
    member joins again until Tansu restarts (docs/decisions/045-kafka-chaos-run-tansu.md). A member
    stopping then does not leave (a heartbeat tells it the group re-forms): Tansu drops it after its
    session and the other joins alone. With the LeaveGroup sent, b never joins."""

    async def member(name: str) -> KafkaGroup:
        client = clients()
        await client.bootstrap()
        return KafkaGroup(
            client=lambda: client,
            cluster=lambda: None,
            settings=settings(3.0, topic),
            on_change=lambda: None,
            instance_id=name,
            error_backoff=0.1,
        )

    a, b = await member("a"), await member("b")
    try:
        await a.start()
        await wait_until(lambda: a.generation is not None, 30, "a to form the group (its leader)")
        await b.start()
        # b's first JoinGroup answered MEMBER_ID_REQUIRED: the formed group is forming again
        await wait_until(lambda: b.member_id, 15, "b to get a member id")
        await a.stop()  # the leader stops while the group forms
        await wait_until(lambda: b.generation is not None, 25, "b to join the group alone")
        assert b.members == ("b",)
    finally:
        await b.stop()
        await a.stop()
