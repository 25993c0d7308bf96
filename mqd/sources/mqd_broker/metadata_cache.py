"""The mqd broker's cluster metadata as its consumer source sees it: parsed once per refresh.

Any reachable node answers ``GET /v1/metadata`` with the whole layout (docs/protocol.md). The cache
asks the nodes it already knows first and the bootstrap URLs last, refreshes every
``metadata_refresh_interval`` and at once when a fetcher reports a routing error or a dead node.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from mqd.backoff import Backoff
from mqd.client import BrokerClient, BrokerError
from mqd.consumer.errors import ConsumerError
from mqd.metadata import ClusterMetadata, MetadataError
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer.metadata")


class MetadataCache:
    """The current ClusterMetadata, refreshed in the background and on demand."""

    def __init__(
        self,
        client: BrokerClient,
        bootstrap: list[str],
        *,
        refresh_interval: float,
        error_backoff: float = 0.1,
        request_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._bootstrap = [u.rstrip("/") for u in bootstrap]
        self._interval = refresh_interval
        self._timeout = request_timeout  # per node: a hung node must not stall the refresh
        self._base_backoff = error_backoff
        self._backoff = Backoff(error_backoff, 5.0)  # failed background refreshes in a row
        self._clock = clock
        self.current: ClusterMetadata | None = None
        self.last_error: str | None = None
        self.refreshes = 0
        self._listeners: list[Callable[[ClusterMetadata], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Callable[[ClusterMetadata], None]) -> None:
        """``fn(metadata)`` runs after every successful refresh."""
        self._listeners.append(fn)

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
                    raise ConsumerError(
                        f"no broker answered metadata (tried {', '.join(self._urls())}): {exc}",
                        retriable=True,
                    ) from exc
                await asyncio.sleep(delay)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-metadata")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request_refresh(self) -> None:
        self._wake.set()

    def _urls(self) -> list[str]:
        urls: list[str] = []
        md = self.current
        if md is not None:
            nodes = sorted(md.nodes.values(), key=lambda n: not n.alive)
            urls.extend(n.url for n in nodes)
        urls.extend(u for u in self._bootstrap if u not in urls)
        return urls

    async def refresh(self) -> ClusterMetadata:
        """Ask known nodes (live ones first), then the bootstrap list; the first answer wins."""
        errors = []
        for url in self._urls():
            try:
                async with asyncio.timeout(self._timeout):
                    answer = await self._client.metadata(url)
                md = ClusterMetadata.parse(answer)
            except TimeoutError:
                errors.append(f"{url}: no answer within {self._timeout}s")
                continue
            except (BrokerError, MetadataError) as exc:
                errors.append(f"{url}: {exc}")
                continue
            self.current = md
            self.last_error = None
            self.refreshes += 1
            for fn in self._listeners:
                try:
                    fn(md)
                except Exception:
                    log.exception("metadata listener failed")
            return md
        self.last_error = "; ".join(errors) or "no broker URL known"
        raise ConsumerError(f"metadata refresh failed: {self.last_error}", retriable=True)

    async def _run(self) -> None:
        while self._task is not None:  # stop() clears it before cancelling
            await wait_event(self._wake, self._interval)
            self._wake.clear()
            try:
                await self.refresh()
            except ConsumerError as exc:
                log.warning("metadata refresh failed", error=str(exc))
                await asyncio.sleep(self._backoff.next())
                self._wake.set()  # keep trying, paced by the backoff
            else:
                self._backoff.reset()
            # never refresh more often than every 50 ms, however many fetchers ask
            await asyncio.sleep(0.05)
