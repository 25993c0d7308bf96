"""MetadataRefresh: a source's cluster metadata, refreshed in the background and on demand.

Both sources (the mqd broker's MetadataCache, Kafka's KafkaMetadata) keep their current metadata
the same way: a first refresh retried with backoff until a deadline (start fails when no node
answered in time), then a background loop that refreshes every ``refresh_interval``, at once when
a fetcher asks (``request_refresh``), and after a failure again paced by the backoff. A subclass
says only how one refresh asks its cluster (``refresh``, which calls ``_publish`` with what it
read) and how a failed start reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

from mqd.backoff import Backoff
from mqd.consumer.errors import ConsumerError
from mqd.waiting import cancel_and_wait, wait_event

M = TypeVar("M")

MIN_REFRESH_GAP_S = 0.05  # never refresh more often, however many fetchers ask


class MetadataRefresh(Generic[M]):
    """The current metadata ``M``, its listeners and the refresh loop."""

    task_name = "mqd-metadata"

    def __init__(
        self,
        *,
        refresh_interval: float,
        error_backoff: float,
        request_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        log: structlog.stdlib.BoundLogger | None = None,
    ) -> None:
        self._interval = refresh_interval
        self._timeout = request_timeout  # per node: a hung node must not stall the refresh
        self._base_backoff = error_backoff
        self._backoff = Backoff(error_backoff, 5.0)  # failed background refreshes in a row
        self._clock = clock
        self._log = log if log is not None else structlog.get_logger("mqd.consumer.metadata")
        self.current: M | None = None
        self.last_error: str | None = None
        self.refreshes = 0
        self._listeners: list[Callable[[M], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Callable[[M], None]) -> None:
        """``fn(metadata)`` runs after every successful refresh."""
        self._listeners.append(fn)

    def request_refresh(self) -> None:
        self._wake.set()

    async def refresh(self) -> M:
        """Ask the cluster once; ``_publish`` what it answered; raises a retriable ConsumerError."""
        raise NotImplementedError

    def _start_failed(self, exc: ConsumerError) -> str:
        """The message of a start that found no node answering by its deadline."""
        return f"no broker answered metadata: {exc}"

    async def start(self, timeout: float) -> None:
        """First refresh (retried until ``timeout``), then the background loop."""
        deadline = self._clock() + timeout
        backoff = Backoff(self._base_backoff, 2.0)
        while True:
            try:
                await self.refresh()
                break
            except ConsumerError as exc:
                delay = backoff.next()
                if self._clock() + delay > deadline:
                    raise ConsumerError(self._start_failed(exc), retriable=True) from exc
                await asyncio.sleep(delay)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.task_name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def _publish(self, md: M) -> M:
        """``md`` becomes the current metadata; every listener hears of it."""
        self.current = md
        self.last_error = None
        self.refreshes += 1
        for fn in self._listeners:
            try:
                fn(md)
            except Exception:
                self._log.exception("metadata listener failed")
        return md

    async def _run(self) -> None:
        while self._task is not None:  # stop() clears it before cancelling
            await wait_event(self._wake, self._interval)
            self._wake.clear()
            try:
                await self.refresh()
            except ConsumerError as exc:
                self._log.warning("metadata refresh failed", error=str(exc))
                await asyncio.sleep(self._backoff.next())
                self._wake.set()  # keep trying, paced by the backoff
            else:
                self._backoff.reset()
            await asyncio.sleep(MIN_REFRESH_GAP_S)
