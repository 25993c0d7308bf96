"""Allocation strategies: pure functions, checked by properties over random groups."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.consumer import (
    ConsumerError,
    TopicPartition,
    allocate_averagely,
    allocate_averagely_by_circle,
    get_strategy,
    register_strategy,
    strategy_names,
)

STRATEGIES = ["averagely", "averagely-by-circle", "consistent-hash", "sticky"]

members_st = st.lists(
    st.text("abcdefgh0123456789-", min_size=1, max_size=12), min_size=1, max_size=12, unique=True
)
partitions_st = st.integers(min_value=0, max_value=64).map(
    lambda n: [TopicPartition("t" if i % 2 else "u", i) for i in range(n)]
)


def global_allocation(
    name: str, members: list[str], partitions: list[TopicPartition]
) -> dict[str, list[TopicPartition]]:
    fn = get_strategy(name)
    ms, ps = sorted(members), sorted(partitions)
    return {m: fn(m, ms, ps) for m in ms}


@pytest.mark.parametrize("name", STRATEGIES)
@settings(max_examples=60, deadline=None)
@given(members=members_st, partitions=partitions_st)
def test_every_partition_owned_exactly_once(
    name: str, members: list[str], partitions: list[TopicPartition]
) -> None:
    """Each strategy gives every partition to exactly one member, and nothing else."""
    alloc = global_allocation(name, members, partitions)
    owners = Counter(p for owned in alloc.values() for p in owned)
    assert set(owners) == set(partitions)
    assert all(c == 1 for c in owners.values())


@pytest.mark.parametrize("name", STRATEGIES)
@settings(max_examples=40, deadline=None)
@given(members=members_st, partitions=partitions_st, seed=st.randoms())
def test_members_agree_whatever_order_they_saw(
    name: str, members: list[str], partitions: list[TopicPartition], seed: random.Random
) -> None:
    """Members that sort the same lists compute the same global allocation, whatever order the
    lists arrived in (the inputs are sorted before allocating, as the rebalancer does)."""
    shuffled_m, shuffled_p = list(members), list(partitions)
    seed.shuffle(shuffled_m)
    seed.shuffle(shuffled_p)
    assert global_allocation(name, members, partitions) == global_allocation(name, shuffled_m, shuffled_p)


@pytest.mark.parametrize("name", ["averagely", "averagely-by-circle", "sticky"])
@settings(max_examples=60, deadline=None)
@given(members=members_st, partitions=partitions_st)
def test_average_strategies_balanced_within_one(
    name: str, members: list[str], partitions: list[TopicPartition]
) -> None:
    """Averagely, by-circle and sticky: member loads differ by at most one partition."""
    sizes = [len(v) for v in global_allocation(name, members, partitions).values()]
    assert max(sizes) - min(sizes) <= 1


def test_averagely_matches_rocketmq_ranges() -> None:
    """Averagely hands out contiguous ranges, the first (n % m) members one more (RocketMQ)."""
    ps = list(range(10))
    ms = ["a", "b", "c"]
    assert [allocate_averagely(m, ms, ps) for m in ms] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [allocate_averagely(m, ms, [0, 1]) for m in ms] == [[0], [1], []]


def test_by_circle_matches_rocketmq_round_robin() -> None:
    """By circle: member i owns i, i+m, i+2m..."""
    ps = list(range(7))
    ms = ["a", "b", "c"]
    assert [allocate_averagely_by_circle(m, ms, ps) for m in ms] == [[0, 3, 6], [1, 4], [2, 5]]


@pytest.mark.parametrize("name", STRATEGIES)
def test_non_member_gets_nothing(name: str) -> None:
    """A consumer missing from the member list owns nothing (it is not in the group yet)."""
    assert get_strategy(name)("zz", ["a", "b"], [TopicPartition("t", i) for i in range(8)]) == []


def test_consistent_hash_moves_little_when_a_member_joins() -> None:
    """Consistent hash: a new member takes partitions only from others, and far fewer than a full
    reshuffle would move."""
    ps = [TopicPartition("t", i) for i in range(200)]
    before = global_allocation("consistent-hash", ["a", "b", "c", "d"], ps)
    after = global_allocation("consistent-hash", ["a", "b", "c", "d", "e"], ps)
    moved = sum(1 for m in before for p in before[m] if p not in after[m])
    assert moved == len(after["e"])  # everything that moved went to the newcomer
    assert moved < len(ps) // 2


def test_registry_is_pluggable_and_unknown_names_fail_clearly() -> None:
    """register_strategy adds a named strategy; an unknown name raises a ConsumerError listing
    the known ones."""

    def everything_to_first(cid: str, members, partitions):  # type: ignore[no-untyped-def]
        return list(partitions) if members and cid == members[0] else []

    register_strategy("test-first-takes-all", everything_to_first)
    assert "test-first-takes-all" in strategy_names()
    assert get_strategy("test-first-takes-all")("a", ["a", "b"], [1, 2]) == [1, 2]
    with pytest.raises(ConsumerError, match="averagely"):
        get_strategy("no-such-strategy")
