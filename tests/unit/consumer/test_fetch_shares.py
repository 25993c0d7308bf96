"""How a fetch request's bytes are shared (mqd.consumer.fetch_shares): by example and as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqd.consumer.fetch_shares import share_request

MiB = 1 << 20


def test_a_lone_backlog_takes_what_caught_up_partitions_leave() -> None:
    """The hot-partition case: one partition with a backlog and three caught up on the node; the
    request of 4 x 4 MiB lets the hot one take all 16 MiB (the broker fills by what exists), after
    the caught-up ones, which keep their own 4 MiB share."""
    shares = share_request([False, True, False, False], 16 * MiB, 4 * MiB, turn=0)
    assert shares.order == [0, 2, 3, 1]
    assert shares.max_bytes == [4 * MiB, 4 * MiB, 4 * MiB, 16 * MiB]


def test_every_partition_with_a_backlog_gets_its_usual_share() -> None:
    """When all have a backlog and the request is partitions x partition_max_bytes, every
    partition gets exactly partition_max_bytes (the request is what it always was)."""
    shares = share_request([True] * 4, 16 * MiB, 4 * MiB, turn=0)
    assert sorted(shares.order) == [0, 1, 2, 3]
    assert shares.max_bytes == [4 * MiB] * 4


def test_a_small_request_caps_every_share() -> None:
    """A request the byte budget made smaller than partition_max_bytes: no share exceeds it."""
    shares = share_request([False, True], 1000, 4 * MiB, turn=3)
    assert shares.max_bytes == [1000, 1000]


@given(
    backlog=st.lists(st.booleans(), min_size=1, max_size=30),
    total=st.integers(1, 1 << 30),
    pmb=st.integers(1, 1 << 26),
    turn=st.integers(0, 10**6),
)
def test_shares_properties(backlog: list[bool], total: int, pmb: int, turn: int) -> None:
    """Every partition is asked for once; caught-up partitions come first with
    min(partition_max_bytes, total); a partition with a backlog gets at least that and never more
    than the request; with a backlog the partitions together may ask for the whole request."""
    shares = share_request(backlog, total, pmb, turn)
    assert sorted(shares.order) == list(range(len(backlog)))
    least = min(pmb, total)
    idle = backlog.count(False)
    assert all(not backlog[i] for i in shares.order[:idle])
    for i, share in zip(shares.order, shares.max_bytes, strict=True):
        assert least <= share <= total
        if not backlog[i]:
            assert share == least
    busy = len(backlog) - idle
    if busy:
        assert sum(shares.max_bytes[idle:]) >= total - busy  # what integer division leaves


@given(n=st.integers(1, 20), idle=st.integers(0, 5), start=st.integers(0, 1000))
def test_round_robin_no_partition_starves(n: int, idle: int, start: int) -> None:
    """Over n consecutive requests, each of the n partitions with a backlog is the first of them
    once: however small the request, every one of them is filled first in turn."""
    backlog = [False] * idle + [True] * n
    firsts = {share_request(backlog, 10, 4, turn).order[idle] for turn in range(start, start + n)}
    assert firsts == set(range(idle, idle + n))
