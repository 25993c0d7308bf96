"""The "stuck" verdict of the log-end poller (mqd.consumer.log_end_poller.StuckTracker): stuck only
after ``stuck_intervals`` polls without landed progress while behind and with the log end grown
since the stall began; any landed progress, or catching up, clears it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqd.consumer.log_end_poller import StuckTracker
from mqd.topic_partition import TopicPartition

TP = TopicPartition("events", 0)


def test_stuck_after_n_polls_while_the_log_end_grows() -> None:
    """Three polls with nothing landed and the log end growing: stuck at the third, not before."""
    t = StuckTracker(3)
    assert not t.observe(TP, 100, 100)  # caught up: the stall is counted from here
    assert not t.observe(TP, 100, 110)
    assert not t.observe(TP, 100, 120)
    assert t.observe(TP, 100, 130) and t.is_stuck(TP) and t.stalled(TP) == 3


def test_a_backlog_that_does_not_grow_is_not_stuck() -> None:
    """Behind but the log end never moved since the stall began (e.g. nothing produced while the
    landing waits): not stuck, however long; once the log end grows it is."""
    t = StuckTracker(2)
    for _ in range(10):
        assert not t.observe(TP, 50, 100)
    assert t.observe(TP, 50, 101)


def test_landed_progress_or_catching_up_clears_it() -> None:
    """Any landed progress resets the count; so does reaching the log end."""
    t = StuckTracker(1)
    t.observe(TP, 0, 10)
    assert t.observe(TP, 0, 20)
    assert not t.observe(TP, 5, 30) and t.stalled(TP) == 0
    assert t.observe(TP, 5, 40)
    assert not t.observe(TP, 40, 40)
    t.forget(TP)
    assert not t.is_stuck(TP) and t.stalled(TP) == 0


def test_nothing_landed_yet_counts_as_behind() -> None:
    """A partition with no landed offset at all (None) stalls like any other."""
    t = StuckTracker(1)
    t.observe(TP, None, 0)
    assert t.observe(TP, None, 5)


@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=40),
)
def test_stuck_implies_the_definition(n: int, steps: list[tuple[int, int]]) -> None:
    """Whatever the sequence of (landed advance, log-end advance), a stuck verdict holds only when
    the last n+1 polls saw the same landed offset, behind the log end in the last n of them, and the
    log end grew since the stall began (it stays stuck while the stall lasts)."""
    t = StuckTracker(n)
    landed, end = 0, 0
    history: list[tuple[int, int]] = []
    for d_landed, d_end in steps:
        end += d_end
        landed = min(end, landed + d_landed)
        history.append((landed, end))
        stuck = t.observe(TP, landed, end)
        if stuck:
            window = history[-(n + 1) :]
            assert len(window) == n + 1
            assert all(lo == landed for lo, _ in window)
            assert all(lo < e for lo, e in window[1:])
            start = len(history) - 1  # the poll the stall is counted from
            while start > 0 and history[start - 1][0] == landed and history[start][0] < history[start][1]:
                start -= 1
            assert end > history[start][1]
