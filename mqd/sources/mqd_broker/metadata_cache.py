"""The mqd broker's cluster metadata as its consumer source sees it: parsed once per refresh.

Any reachable node answers ``GET /v1/metadata`` with the whole layout (docs/protocol.md). The cache
asks the nodes it already knows first and the bootstrap URLs last, refreshes every
``metadata_refresh_interval`` and at once when a fetcher reports a routing error or a dead node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from mqd.consumer.errors import ConsumerError
from mqd.consumer.metadata_refresh import MetadataRefresh
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.metadata import ClusterMetadata, MetadataError

log = structlog.get_logger("mqd.consumer.metadata")


class MetadataCache(MetadataRefresh[ClusterMetadata]):
    """The current ClusterMetadata, refreshed in the background and on demand."""

    task_name = "mqd-metadata"

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
        super().__init__(
            refresh_interval=refresh_interval,
            error_backoff=error_backoff,
            request_timeout=request_timeout,
            clock=clock,
            log=log,
        )
        self._client = client
        self._bootstrap = [u.rstrip("/") for u in bootstrap]

    def _start_failed(self, exc: ConsumerError) -> str:
        return f"no broker answered metadata (tried {', '.join(self._urls())}): {exc}"

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
            return self._publish(md)
        self.last_error = "; ".join(errors) or "no broker URL known"
        raise ConsumerError(f"metadata refresh failed: {self.last_error}", retriable=True)
