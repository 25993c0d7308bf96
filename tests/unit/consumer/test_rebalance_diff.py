"""The membership's answer ("my assignment and its member version") and the rebalance diff,
table-driven: broadcast owns everything, a group member owns its strategy share, a member not in
the list yet has no answer, an expired session owns nothing; the diff revokes and assigns exactly
the difference."""

from __future__ import annotations

import time

import pytest

from mqd.consumer.membership import Broadcast
from mqd.consumer.rebalance import Diff, diff
from mqd.consumer.source import Assignment
from mqd.sources.mqd_broker import GroupCoordinator, MetadataCache
from mqd.topic_partition import TopicPartition
from mqd.wire.client import BrokerClient

TPS = [TopicPartition("t", i) for i in range(6)]


def tps(*ids: int) -> frozenset[TopicPartition]:
    return frozenset(TPS[i] for i in ids)


@pytest.mark.parametrize(
    ("owned", "target", "removed", "added"),
    [
        ((), (0, 1), (), (0, 1)),
        ((0, 1), (0, 1), (), ()),
        ((0, 1, 2), (2, 3), (0, 1), (3,)),
        ((0, 1), (), (0, 1), ()),
    ],
)
def test_diff(
    owned: tuple[int, ...], target: tuple[int, ...], removed: tuple[int, ...], added: tuple[int, ...]
) -> None:
    """Revoke what is owned and not in the assignment; assign what is in it and not owned."""
    assert diff(tps(*owned), Assignment(tps(*target), 1, ("a",))) == Diff(tps(*removed), tps(*added))


def test_broadcast_owns_every_partition() -> None:
    """Broadcast: no group, no member version, every subscribed partition."""
    b = Broadcast("me")
    assert b.assignment(TPS) == Assignment(frozenset(TPS), None, ())
    assert (b.members, b.member_version, b.coordinator, b.last_error) == (("me",), None, None, None)


def coordinator(member: str, allocation: str = "averagely") -> GroupCoordinator:
    cache = MetadataCache(BrokerClient(), ["http://127.0.0.1:1"], refresh_interval=60)
    return GroupCoordinator(
        client=BrokerClient(),
        metadata=cache,
        group="g",
        client_id=member,
        topics=["t"],
        heartbeat_interval=1,
        session_timeout=10,
        on_members_changed=lambda: None,
        allocation=allocation,
    )


@pytest.mark.parametrize(
    ("member", "members", "mine"),
    [
        ("a", ("a", "b"), (0, 1, 2)),
        ("b", ("a", "b"), (3, 4, 5)),
        ("b", ("a", "b", "c", "d"), (2, 3)),
        ("d", ("a", "b", "c", "d"), (5,)),
    ],
)
def test_group_member_owns_its_strategy_share(
    member: str, members: tuple[str, ...], mine: tuple[int, ...]
) -> None:
    """The mqd broker source runs the strategy in the member over the sorted member list."""
    c = coordinator(member)
    c.members, c.member_version = members, 7
    assert c.assignment(TPS) == Assignment(tps(*mine), 7, members)


def test_not_a_member_yet_has_no_answer_and_beats_now() -> None:
    """Not in the member list: no assignment (the engine keeps what it owns) and a heartbeat now."""
    c = coordinator("z")
    c.members, c.member_version = ("a", "b"), 3
    assert c.assignment(TPS) is None
    assert c._wake.is_set()


def test_expired_session_owns_nothing() -> None:
    """No heartbeat answered for a whole session: the others own our partitions by now."""
    c = coordinator("a")
    c.members, c.member_version = ("a",), 2
    c.last_success = time.monotonic() - 11
    assert c.assignment(TPS) == Assignment(frozenset(), 2, ())
