"""Group membership: heartbeats to the group's coordinator node (cluster mode only).

The coordinator of group ``g`` is the master of ``groups[crc32(g) % len(groups)]`` (its first live
slave while it is down); any other node answers 421 ``not_coordinator`` naming the right one, which
we follow. Every heartbeat returns the sorted member list and its version; a new version asks the
consumer to rebalance at once (RocketMQ's "notify consumer ids changed").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from mqd.client import BrokerClient, BrokerError
from mqd.consumer.metadata import MetadataCache
from mqd.consumer.state import ConsumerError
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer.coordinator")

R = TypeVar("R")


class GroupCoordinator:
    """Finds the coordinator, keeps this member alive in the group and tracks the member list."""

    def __init__(
        self,
        *,
        client: BrokerClient,
        metadata: MetadataCache,
        group: str,
        client_id: str,
        topics: list[str],
        heartbeat_interval: float,
        session_timeout: float,
        on_members_changed: Callable[[], None],
        request_timeout: float = 5.0,
    ) -> None:
        self._client = client
        self._metadata = metadata
        self.group = group
        self.client_id = client_id
        self.topics = list(topics)
        self.heartbeat_interval = heartbeat_interval
        self.session_timeout = session_timeout
        self.request_timeout = request_timeout
        self._on_change = on_members_changed
        self.members: tuple[str, ...] = ()
        self.version: int | None = None
        self.coordinator_url: str | None = None
        self.coordinator_id: str | None = None
        self.last_error: str | None = None
        self.heartbeats = 0
        self.last_success: float | None = None  # monotonic time of the last answered heartbeat
        self._expiry_reported = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- requests to the coordinator -------------------------------------------------------------

    def _locate(self) -> str:
        md = self._metadata.current
        node = md.coordinator(self.group) if md is not None else None
        if node is None:
            raise ConsumerError(f"group {self.group!r}: no coordinator known (no metadata)", retriable=True)
        self.coordinator_id = node.id
        return node.url

    async def call(self, fn: Callable[[str], Awaitable[R]], attempts: int = 3) -> R:
        """Run ``fn(coordinator_url)``, following not_coordinator answers and re-locating after a
        transport error; raises the last error after ``attempts``."""
        url = self.coordinator_url or self._locate()
        last: BrokerError | None = None
        for _ in range(attempts):
            try:
                try:
                    async with asyncio.timeout(self.request_timeout):
                        result = await fn(url)
                except TimeoutError:
                    raise BrokerError(f"{url}: no answer within {self.request_timeout:.1f}s") from None
                self.coordinator_url = url
                return result
            except BrokerError as exc:
                last = exc
                if exc.status == 421 and exc.code == "not_coordinator":
                    named = exc.body.get("coordinator_url")
                    self.coordinator_id = exc.body.get("coordinator")
                    url = str(named).rstrip("/") if named else self._locate()
                    continue
                if not exc.retriable:
                    raise
                # dead or failing node: the metadata may name another coordinator by now
                self.coordinator_url = None
                self._metadata.request_refresh()
                with contextlib.suppress(ConsumerError):
                    await self._metadata.refresh()
                url = self._locate()
        assert last is not None
        raise last

    # -- membership ------------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        session_ms = max(100, int(self.session_timeout * 1000))
        answer: dict[str, Any] = await self.call(
            lambda url: self._client.heartbeat(url, self.group, self.client_id, self.topics, session_ms)
        )
        try:
            members = tuple(sorted(str(m) for m in answer["members"]))
            version = int(answer["version"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConsumerError(f"malformed heartbeat answer: {answer!r}", retriable=True) from exc
        self.heartbeats += 1
        self.last_error = None
        self.last_success = time.monotonic()
        if self._expiry_reported:
            self._expiry_reported = False
            changed = True
        else:
            changed = False
        if answer.get("coordinator"):
            self.coordinator_id = str(answer["coordinator"])
        changed = changed or version != self.version or members != self.members
        self.members, self.version = members, version
        if changed:
            log.info("group members changed", group=self.group, version=version, members=list(members))
            self._on_change()

    async def start(self) -> None:
        """First heartbeat (failure is logged, the loop keeps trying), then the heartbeat loop."""
        try:
            await self.heartbeat()
        except (BrokerError, ConsumerError) as exc:
            self.last_error = str(exc)
            log.warning("first heartbeat failed", group=self.group, error=str(exc))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-heartbeat")

    def beat_now(self) -> None:
        self._wake.set()

    def session_expired(self) -> bool:
        """No heartbeat answered for a whole session timeout: the coordinator has dropped us by now
        and the others own our partitions, so we must not keep them (Kafka's partitions lost)."""
        return self.last_success is not None and time.monotonic() - self.last_success > self.session_timeout

    async def _run(self) -> None:
        delay = self.heartbeat_interval
        while self._task is not None:  # stop() clears it before cancelling
            await wait_event(self._wake, delay)
            self._wake.clear()
            try:
                await self.heartbeat()
                delay = self.heartbeat_interval
            except (BrokerError, ConsumerError) as exc:
                self.last_error = str(exc)
                log.warning("heartbeat failed", group=self.group, error=str(exc))
                if self.session_expired() and not self._expiry_reported:
                    self._expiry_reported = True
                    log.error("group session expired; releasing partitions", group=self.group)
                    self._on_change()
                # retry sooner than the interval so the session does not expire over one lost beat
                delay = min(self.heartbeat_interval, max(0.1, self.session_timeout / 10))

    async def stop(self, leave: bool = True) -> None:
        """Stop heartbeating and leave the group so the others rebalance now; idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if leave:
            try:
                await self.call(lambda url: self._client.leave(url, self.group, self.client_id), attempts=2)
                log.info("left group", group=self.group, client_id=self.client_id)
            except (BrokerError, ConsumerError) as exc:
                log.warning("leave failed; the session will expire", group=self.group, error=str(exc))
