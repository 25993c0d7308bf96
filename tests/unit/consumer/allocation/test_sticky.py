"""The ``sticky`` strategy (mqd/consumer/allocation/sticky.py), checked by properties.

Proves that with what each member owns (a Kafka group's leader knows it) a joining member takes only
what the others must give up and nothing moves between the others, a leaving member's partitions
alone move, and any ownership (unbalanced, stale, naming unknown partitions or members) comes out
balanced while every member keeps at least its quota of what it held; that with the member list
alone (the mqd broker) the result is still balanced and the same whatever the input order; and that
``allocate_group`` gives the same shares as the per-member form when no ownership is known.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.consumer.allocation import allocate_group, allocate_sticky, assign_sticky
from mqd.topic_partition import TopicPartition

members_st = st.lists(st.text("abcdef0123-", min_size=1, max_size=8), min_size=1, max_size=10, unique=True)
counts_st = st.integers(min_value=0, max_value=80)


def parts(n: int) -> list[TopicPartition]:
    return sorted(TopicPartition("t" if i % 3 else "u", i) for i in range(n))


def balanced(shares: dict[str, list[TopicPartition]], n: int) -> bool:
    sizes = sorted(len(v) for v in shares.values())
    base, extras = divmod(n, len(shares))
    return sizes == [base] * (len(shares) - extras) + [base + 1] * extras


def owner_of(shares: dict[str, list[TopicPartition]]) -> dict[TopicPartition, str]:
    return {p: m for m, held in shares.items() for p in held}


@settings(max_examples=150, deadline=None)
@given(members=members_st, n=counts_st, newcomer=st.text("xyz", min_size=1, max_size=4))
def test_a_joining_member_takes_only_what_balance_needs(members: list[str], n: int, newcomer: str) -> None:
    """Starting from a sticky allocation, a new member's join moves partitions only to it, exactly
    its new quota, and never between the members that were there."""
    ps = parts(n)
    before = assign_sticky(members, ps)
    after = assign_sticky([*members, newcomer], ps, before)
    assert balanced(after, n)
    moved = [p for p, m in owner_of(after).items() if owner_of(before)[p] != m]
    assert all(owner_of(after)[p] == newcomer for p in moved)
    assert len(moved) == len(after[newcomer])


@settings(max_examples=150, deadline=None)
@given(members=members_st.filter(lambda ms: len(ms) > 1), n=counts_st, seed=st.randoms())
def test_a_leaving_member_moves_only_its_own(members: list[str], n: int, seed: random.Random) -> None:
    """When a member leaves, the others keep everything they had; only its partitions move."""
    ps = parts(n)
    before = assign_sticky(members, ps)
    gone = seed.choice(members)
    rest = [m for m in members if m != gone]
    after = assign_sticky(rest, ps, {m: before[m] for m in rest})
    assert balanced(after, n)
    assert all(set(before[m]) <= set(after[m]) for m in rest)


@settings(max_examples=200, deadline=None)
@given(
    members=members_st,
    n=counts_st,
    owned=st.dictionaries(
        st.text("abcdefxyz", min_size=1, max_size=3),
        st.lists(st.integers(0, 100).map(lambda i: TopicPartition("t" if i % 3 else "u", i)), max_size=40),
        max_size=12,
    ),
)
def test_any_ownership_comes_out_balanced_and_kept_up_to_the_quota(
    members: list[str], n: int, owned: dict[str, list[TopicPartition]]
) -> None:
    """Whatever members claim (too much, claimed twice, partitions or members that do not exist),
    every partition goes to exactly one member, the shares are balanced, and each member keeps at
    least min(its valid claims, n // m) of what it held."""
    ps = parts(n)
    shares = assign_sticky(members, ps, owned)
    assert sorted(p for held in shares.values() for p in held) == ps
    assert balanced(shares, n)
    claimed: set[TopicPartition] = set()
    for m in sorted(members):
        valid = [p for p in dict.fromkeys(owned.get(m, ())) if p in set(ps) and p not in claimed]
        claimed.update(valid)
        assert len(set(valid) & set(shares[m])) >= min(len(valid), n // len(members))


@settings(max_examples=60, deadline=None)
@given(members=members_st, n=counts_st, seed=st.randoms())
def test_the_member_list_alone_gives_one_answer(members: list[str], n: int, seed: random.Random) -> None:
    """Without ownership the allocation depends on the sets only (each mqd-broker member computes
    it alone), and allocate_group matches the per-member form."""
    ps = parts(n)
    shuffled_m, shuffled_p = list(members), list(ps)
    seed.shuffle(shuffled_m)
    seed.shuffle(shuffled_p)
    whole = assign_sticky(members, ps)
    assert whole == {m: sorted(v) for m, v in assign_sticky(shuffled_m, shuffled_p).items()}
    assert whole == {m: allocate_sticky(m, sorted(members), ps) for m in sorted(members)}
    assert whole == allocate_group("sticky", members, ps)


def test_rendezvous_start_moves_few_when_a_member_joins() -> None:
    """With the member list alone a join still moves far fewer partitions than a reshuffle: on 240
    partitions and 4 -> 5 members, at most 1.5x the newcomer's share (averagely moves ~60 %)."""
    ps = parts(240)
    before = assign_sticky(["a", "b", "c", "d"], ps)
    after = assign_sticky(["a", "b", "c", "d", "e"], ps)
    moved = sum(1 for p, m in owner_of(after).items() if owner_of(before)[p] != m)
    assert len(after["e"]) == 48
    assert moved <= 72, moved
