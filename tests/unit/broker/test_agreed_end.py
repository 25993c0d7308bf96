"""The agreed end of two replicas' logs from their incarnation histories (replica_divergence.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqd.broker.replica_divergence import agreed_end
from mqd.wire.incarnation import IncarnationEntry as E

A, B, C, D = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)


def test_same_incarnation_agrees_up_to_the_shorter_log() -> None:
    """One shared current incarnation: the logs agree up to the shorter end."""
    assert agreed_end([E(A, 0)], 100, [E(A, 0)], 60) == 60
    assert agreed_end([E(A, 0)], 60, [E(A, 0)], 100) == 60


def test_a_later_incarnation_on_one_side_ends_the_agreement_at_its_base() -> None:
    """The master truncated at 40 and wrote B there: a slave still on A agrees up to 40 only, even
    when both logs are 100 long (same offsets, other records: what offsets alone cannot see)."""
    assert agreed_end([E(A, 0)], 100, [E(A, 0), E(B, 40)], 100) == 40
    assert agreed_end([E(A, 0), E(B, 40)], 100, [E(A, 0)], 100) == 40


def test_newest_common_incarnation_counts() -> None:
    """Both adopted A then B; the master went on to C at 90: agreed up to 90 (or the slave's end)."""
    assert agreed_end([E(A, 0), E(B, 50)], 120, [E(A, 0), E(B, 50), E(C, 90)], 95) == 90
    assert agreed_end([E(A, 0), E(B, 50)], 70, [E(A, 0), E(B, 50), E(C, 90)], 95) == 70


def test_no_common_incarnation_is_none() -> None:
    """A replaced data dir (a new id) or two logs upgraded separately: no agreement by content."""
    assert agreed_end([E(A, 0)], 10, [E(D, 0)], 10) is None


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=5),
    my_end=st.integers(min_value=0, max_value=2000),
    their_end=st.integers(min_value=0, max_value=2000),
)
def test_agreement_never_exceeds_either_end_and_is_symmetric(
    cuts: list[int], my_end: int, their_end: int
) -> None:
    """For histories that share a prefix, the agreed end is the same from both sides and is never
    past either log's end."""
    bases = sorted(cuts)
    ids = [f"{i:032x}" for i in range(len(bases))]
    history = [E(i, b) for i, b in zip(ids, bases, strict=True)]
    my_end, their_end = max(my_end, bases[-1]), max(their_end, bases[-1])
    got = agreed_end(history, my_end, history[:1], their_end)
    assert got == agreed_end(history[:1], their_end, history, my_end)
    assert got is not None and got <= min(my_end, their_end)
