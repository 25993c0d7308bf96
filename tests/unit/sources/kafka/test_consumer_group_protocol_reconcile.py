"""KIP-848 reconciliation on the member's side (mqd.sources.kafka.consumer_group_protocol.Reconciler),
pure: a revocation is acknowledged only after the engine released it, never before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqd.sources.kafka.consumer_group_protocol import IdPartition, Reconciler

A = "a" * 32
parts = st.frozensets(st.tuples(st.just(A), st.integers(0, 7)), max_size=8)


def test_added_partitions_are_acknowledged_at_once() -> None:
    """A target that only adds is free to own: acknowledged at once."""
    r = Reconciler()
    assert r.new_target({(A, 0), (A, 1)})
    assert r.acked == {(A, 0), (A, 1)} and not r.releasing


def test_a_revocation_waits_for_the_release() -> None:
    """A target that takes a partition away keeps the old acknowledgement until the engine holds
    nothing outside the target any more."""
    r = Reconciler()
    r.new_target({(A, 0), (A, 1)})
    assert not r.new_target({(A, 0)})
    assert r.acked == {(A, 0), (A, 1)} and r.releasing == {(A, 1)}
    assert not r.released({(A, 0), (A, 1)})  # still held: nothing changes
    assert r.released({(A, 0)})
    assert r.acked == {(A, 0)}


def test_given_back_before_release_is_not_released() -> None:
    """A partition revoked and assigned back before the engine let go is simply ours again."""
    r = Reconciler()
    r.new_target({(A, 0), (A, 1)})
    r.new_target({(A, 0)})
    assert r.new_target({(A, 0), (A, 1), (A, 2)})
    assert not r.releasing and r.acked == {(A, 0), (A, 1), (A, 2)}


def test_lose_all_releases_everything_handed_out() -> None:
    """Fenced: nothing acknowledged, everything handed out (acknowledged or not) to be released."""
    r = Reconciler()
    r.new_target({(A, 0)})
    r.new_target({(A, 0), (A, 3)})
    r.lose_all()
    assert r.acked == frozenset() and r.releasing == {(A, 0), (A, 3)} and not r.known


@given(st.lists(st.tuples(parts, parts), min_size=1, max_size=12))
def test_never_acknowledges_a_partition_the_engine_may_hold_outside_the_target(
    steps: list[tuple[frozenset[IdPartition], frozenset[IdPartition]]],
) -> None:
    """Any sequence of targets and engine releases: whatever the engine may still hold outside the
    target is being released (so not acknowledged as given up), and with nothing left to release
    the target is exactly what is acknowledged; the acknowledgement is only ever a target."""
    r = Reconciler()
    may_hold: set[IdPartition] = set()
    targets: list[frozenset[IdPartition]] = [frozenset()]
    for target, held in steps:
        r.new_target(target)
        targets.append(target)
        may_hold |= target
        holds = (held & may_hold) | target  # the engine keeps at most what it was given
        r.released(holds)
        may_hold = set(holds)
        assert frozenset(holds) - r.target <= r.releasing
        if not r.releasing:
            assert r.acked == r.target
        assert r.acked in targets
