"""Requests the node refused to serve: counted per HTTP status, logged at most once per interval.

A malformed or abusive request is the sender's fault, not the node's: logging each one with a
traceback lets anyone flood the log. :class:`RejectedRequests` counts every 4xx answer by status
(served by GET /v1/stats as ``rejected``) and writes one warning line per ``interval_s`` for the
answers that mean the node protected itself (408 body timeout, 413, 429, and requests aiohttp's
parser refused), with the number of lines it held back since the last one.

:class:`ParserErrorLog` is the logger handed to aiohttp's server: aiohttp answers a request it
cannot parse (a request line or header over 8 KiB, a bad chunk, ...) with 400 itself, before any
middleware, and logs it with ``logger.exception``; this logger turns those into
:meth:`RejectedRequests.record` and passes every other record on to ``aiohttp.server``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError

log = structlog.get_logger(__name__)

WARN_INTERVAL_S = 10.0
MAX_REASON_CHARS = 200
WARNED_STATUSES = frozenset({408, 413, 429})  # the node refused to be tied up, not a plain bad field


class RejectedRequests:
    """4xx answers per status, and the rate-limited warning line."""

    def __init__(
        self, interval_s: float = WARN_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self.by_status: dict[int, int] = defaultdict(int)
        self.suppressed = 0  # warnings held back since the last one written
        self._last_warning: float | None = None

    def count(self, status: int) -> None:
        """Count a 4xx answer that needs no log line (a plain validation error, 404, 421...)."""
        self.by_status[status] += 1

    def record(self, status: int, reason: str, **context: Any) -> bool:
        """Count the answer and write the warning unless one was written within ``interval_s``;
        True when it was written."""
        self.by_status[status] += 1
        now = self._clock()
        if self._last_warning is not None and now - self._last_warning < self.interval_s:
            self.suppressed += 1
            return False
        self._last_warning = now
        suppressed, self.suppressed = self.suppressed, 0
        # the reason may quote the request (a 9 KiB URL): a log line stays short
        short = reason if len(reason) <= MAX_REASON_CHARS else reason[:MAX_REASON_CHARS] + "..."
        log.warning("request rejected", status=status, reason=short, suppressed=suppressed, **context)
        return True

    def as_json(self) -> dict[str, int]:
        return {str(status): n for status, n in sorted(self.by_status.items())}


class ParserErrorLog(logging.Logger):
    """aiohttp's server logger: a request its parser refused goes to :meth:`RejectedRequests.record`
    (no traceback), anything else to the ``aiohttp.server`` logger unchanged."""

    def __init__(self, rejected: RejectedRequests) -> None:
        super().__init__("aiohttp.server.mqd")
        self.parent = logging.getLogger("aiohttp.server")
        self.rejected = rejected

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
            remote = args[0] if args else None
            self.rejected.record(exc.code, exc.message.strip(), remote=str(remote), kind=type(exc).__name__)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)
