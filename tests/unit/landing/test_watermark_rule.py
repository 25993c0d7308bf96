"""The watermark rule (mqd/landing/watermark.py): how far a published file moves its partition."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from mqd.landing.layout import FileRange
from mqd.landing.watermark import AheadOfClock, vouched_event_time, watermark_after

PUBLISHED = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CREATED = datetime.fromtimestamp(PUBLISHED / 1000, UTC).isoformat(timespec="milliseconds")
AHEAD = 3_600_000


def rng(ts_max: int, created: str = CREATED, count: int = 3) -> FileRange:
    return FileRange("topic=t/x.parquet", "t", 0, 0, count - 1, count, ts_max, ts_max, 10, created)


def test_a_file_up_to_the_bound_vouches_and_past_it_does_not() -> None:
    """Up to max_ahead past its publication time a file vouches for its newest event time; one
    millisecond further it vouches for nothing. A range without a publication time (older
    landings) keeps the old rule."""
    assert vouched_event_time(rng(PUBLISHED + AHEAD), AHEAD) == PUBLISHED + AHEAD
    assert vouched_event_time(rng(PUBLISHED + AHEAD + 1), AHEAD) is None
    assert vouched_event_time(rng(PUBLISHED + 10 * AHEAD, created=""), AHEAD) == PUBLISHED + 10 * AHEAD


@given(
    st.one_of(st.none(), st.integers(0, 2 * PUBLISHED)),
    st.integers(-(2**62), 2**62),
)
def test_watermark_never_moves_back_nor_past_the_bound(current: int | None, ts_max: int) -> None:
    """Whatever a file holds, the watermark after it is never below the one before it and never
    above the file's publication time + max_ahead unless it already was."""
    after = watermark_after(current, rng(ts_max), AHEAD)
    if current is not None:
        assert after is not None and after >= current
    if after is not None and after != current:
        assert after <= PUBLISHED + AHEAD


def test_ahead_of_clock_counts_every_file_and_logs_at_most_once_per_interval() -> None:
    """Every file stamped past the bound is counted; log lines are rate-limited, and the next
    line says how many files it held back."""
    clock = [0.0]
    ahead = AheadOfClock(AHEAD, interval_s=10.0, clock=lambda: clock[0])
    assert not ahead.note(rng(PUBLISHED))
    assert ahead.note(rng(PUBLISHED + 2 * AHEAD))
    assert ahead.note(rng(PUBLISHED + 2 * AHEAD))
    assert (ahead.records, ahead.suppressed) == (6, 1)
    clock[0] = 11.0
    assert ahead.note(rng(PUBLISHED + 2 * AHEAD, count=4))
    assert (ahead.records, ahead.suppressed) == (10, 0)
