"""The watermark rule: how far one published file moves its partition's event-time watermark.

Event times come from producers. A file whose newest event time is more than
``landing.max_event_ahead`` past the wall clock that published it (a producer's clock two days
fast, a stamp in nanoseconds) still lands, but vouches for nothing: the partition's watermark stays
where it was, so one outlier cannot mark the current hour and every hour up to it complete
(markers.py). Such files are counted and logged (:class:`AheadOfClock`). Pure functions of a
:class:`FileRange`, so every store computes the same watermark, at publication and when it rebuilds
a state from the manifest.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import structlog

from mqd import metrics
from mqd.landing.layout import FileRange

log = structlog.get_logger("mqd.landing.watermark")

DEFAULT_MAX_EVENT_AHEAD_MS = 3_600_000  # landing.max_event_ahead's default (1 h)
AHEAD_LOG_INTERVAL_S = 10.0  # at most one "event time ahead" line per interval and process


def published_at_ms(rng: FileRange) -> int | None:
    """Wall-clock time (ms) at which ``rng`` was staged for publication; None when the range does
    not say (written before ranges carried it) or says something unreadable."""
    if not rng.created:
        return None
    try:
        return int(datetime.fromisoformat(rng.created).timestamp() * 1000)
    except (ValueError, OverflowError):
        return None


def vouched_event_time(rng: FileRange, max_ahead_ms: int) -> int | None:
    """The event time a published file lets its partition's watermark reach: its newest one, or
    None when that is more than ``max_ahead_ms`` past the wall clock that published it.

    A file holds the records of one folder hour (publisher.py), so the whole file is in or out:
    a file stamped far ahead vouches for nothing. Judged against the file's own publication time,
    not "now", so a state rebuilt from the manifest later reaches the same watermark. A range
    without a publication time vouches for its newest event time, as before the bound existed."""
    published = published_at_ms(rng)
    if published is not None and rng.ts_max > published + max_ahead_ms:
        return None
    return rng.ts_max


def watermark_after(current: int | None, rng: FileRange, max_ahead_ms: int) -> int | None:
    """A partition's watermark after publishing ``rng``: it only moves forward, and only to what
    :func:`vouched_event_time` allows."""
    vouched = vouched_event_time(rng, max_ahead_ms)
    if vouched is None:
        return current
    return vouched if current is None else max(current, vouched)


class AheadOfClock:
    """Counts published records stamped past the bound (``mqd_event_time_ahead_records``) and
    logs such files, one warning line per ``interval_s`` with the number held back since."""

    def __init__(
        self,
        max_ahead_ms: int,
        *,
        interval_s: float = AHEAD_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_ahead_ms = max_ahead_ms
        self.interval_s = interval_s
        self._clock = clock
        self._last_line: float | None = None
        self.suppressed = 0  # files not logged since the last line
        self.records = 0  # records counted by this instance

    def note(self, rng: FileRange) -> bool:
        """Count ``rng``'s records when it is stamped past the bound; True when it was."""
        if vouched_event_time(rng, self.max_ahead_ms) is not None:
            return False
        self.records += rng.count
        metrics.event_time_ahead_records.labels(rng.topic).inc(rng.count)
        now = self._clock()
        if self._last_line is not None and now - self._last_line < self.interval_s:
            self.suppressed += 1
            return True
        self._last_line = now
        suppressed, self.suppressed = self.suppressed, 0
        log.warning(
            "event time ahead of the wall clock: landed, but the watermark ignores the file",
            topic=rng.topic,
            partition=rng.partition,
            file=rng.path,
            records=rng.count,
            ts_max=rng.ts_max,
            published=rng.created,
            max_ahead_ms=self.max_ahead_ms,
            files_not_logged=suppressed,
        )
        return True
