"""Rejected requests (mqd/broker/rejected_requests.py): counted per status, warned rate-limited.

Proves that every 4xx is counted, that a burst of warnings writes one line per interval carrying
the number held back, that a long reason is cut, and that aiohttp's parser errors given to
ParserErrorLog become a counted record instead of a logged traceback while other records pass on.
"""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import LineTooLong

from mqd.broker.rejected_requests import MAX_REASON_CHARS, ParserErrorLog, RejectedRequests


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_warning_per_interval_with_the_suppressed_count(caplog: pytest.LogCaptureFixture) -> None:
    """Five 408s in one interval: one line; the next interval's line says 4 were held back."""
    clock = Clock()
    rejected = RejectedRequests(interval_s=10.0, clock=clock)
    written = [rejected.record(408, "slow body") for _ in range(5)]
    assert written == [True, False, False, False, False] and rejected.suppressed == 4
    clock.now += 10.0
    assert rejected.record(429, "full")
    assert rejected.suppressed == 0
    rejected.count(404)
    assert rejected.as_json() == {"404": 1, "408": 5, "429": 1}


def test_parser_errors_are_counted_not_logged_with_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A LineTooLong given to logger.exception is a 400 record (reason cut short), with no traceback;
    any other exception still reaches the aiohttp.server logger with its traceback."""
    rejected = RejectedRequests(clock=Clock())
    logger = ParserErrorLog(rejected)
    caplog.set_level(logging.DEBUG)
    logger.exception("Error handling request from %s", "127.0.0.1", exc_info=LineTooLong(b"x" * 9000, 8190))
    assert rejected.as_json() == {"400": 1}
    assert not [r for r in caplog.records if r.exc_info]
    try:
        raise RuntimeError("a real bug")
    except RuntimeError:
        logger.exception("Unhandled exception")
    bug = [r for r in caplog.records if r.exc_info]
    assert len(bug) == 1 and bug[0].levelno == logging.ERROR
    assert rejected.as_json() == {"400": 1}


def test_a_long_reason_is_cut() -> None:
    """A reason quoting a 9 KiB URL is cut to MAX_REASON_CHARS in the log line (the count still counts)."""
    import structlog

    with structlog.testing.capture_logs() as logs:
        RejectedRequests(clock=Clock()).record(400, "u" * 9000)
    assert len(logs) == 1 and len(logs[0]["reason"]) == MAX_REASON_CHARS + 3
