"""The log-end poller's ArrivalClock dates the first record not landed yet from when the polls saw the
log end move (issue 31: TIME-LAG is the age of the oldest record not committed, 0 when caught up),
interpolated by offset between two polls, bounded in memory, never dated before what it saw."""

from __future__ import annotations

from mqd.consumer.log_end_poller import ArrivalClock
from mqd.topic_partition import TopicPartition

TP = TopicPartition("events", 0)


def test_caught_up_has_no_date_however_long_the_topic_is_idle() -> None:
    """An idle topic whose records all landed: nothing is behind at any poll, for an hour."""
    clock = ArrivalClock()
    assert all(clock.observe(TP, 100, 100, t) is None for t in range(0, 3_600_000, 5_000))


def test_records_after_an_idle_hour_are_dated_by_the_poll_gap_not_the_hour() -> None:
    """The log end sat at 100 for an hour; the next poll sees 101: record 100 arrived within that
    last gap, so it is at most one interval old, not an hour."""
    clock = ArrivalClock()
    for t in range(0, 3_600_001, 5_000):
        clock.observe(TP, 100, 100, t)
    assert clock.observe(TP, 101, 100, 3_605_000) == 3_605_000
    assert clock.observe(TP, 101, 100, 3_610_000) == 3_605_000  # still waiting: the same record


def test_interpolated_by_offset_between_two_polls() -> None:
    """Ten records arrived between polls at 0 and 5000: the first is dated 500, the sixth 3000;
    landing more moves the date forward, landing all clears it."""
    clock = ArrivalClock()
    assert clock.observe(TP, 100, 100, 0) is None
    assert clock.observe(TP, 110, 100, 5_000) == 500
    assert clock.observe(TP, 110, 105, 10_000) == 3_000
    assert clock.observe(TP, 120, 110, 15_000) == 10_000 + 500  # the log end sat at 110 until 10000
    assert clock.observe(TP, 120, 120, 20_000) is None


def test_a_backlog_before_the_first_poll_is_dated_by_that_poll() -> None:
    """What was already in the log when polling began is dated by the first poll (a lower bound of
    its age), and keeps that date while nothing lands."""
    clock = ArrivalClock()
    assert clock.observe(TP, 1_000, 0, 7_000) == 7_000
    assert clock.observe(TP, 1_200, 0, 12_000) == 7_000


def test_a_shorter_log_forgets_what_is_beyond_it() -> None:
    """A log end that goes down (a replaced or truncated log, a replica behind) drops the history
    past it: the record at the landed offset is dated again between the polls that saw the log at
    100 and at 150, never before the last one that saw it at 100."""
    clock = ArrivalClock()
    clock.observe(TP, 100, 100, 0)
    assert clock.observe(TP, 200, 100, 5_000) == 50
    assert clock.observe(TP, 150, 100, 10_000) == 200  # 1/50 of the way from 0 to 10000
    assert clock._points[TP] == [[100, 0, 0], [150, 10_000, 10_000]]
    assert clock.observe(TP, 150, 150, 15_000) is None


def test_memory_is_bounded_while_nothing_lands_and_the_date_stays() -> None:
    """A partition that stays behind for a day of polls keeps at most MAX_POINTS + 1 points, and the
    first unlanded record keeps its date."""
    clock = ArrivalClock()
    clock.observe(TP, 100, 100, 0)
    first = clock.observe(TP, 110, 100, 5_000)
    for n in range(2, 17_280):
        assert clock.observe(TP, 100 + 10 * n, 100, 5_000 * n) == first
    assert len(clock._points[TP]) <= ArrivalClock.MAX_POINTS + 1
    # landing moves on into the thinned history: still dated within what the polls saw
    mid = clock.observe(TP, 100 + 10 * 17_280, 50_000, 5_000 * 17_280)
    assert mid is not None and 5_000 * 4_990 <= mid <= 5_000 * 5_000
