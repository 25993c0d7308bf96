"""Consumer-group membership on the mqd broker: heartbeats to the group's coordinator node.

The coordinator of consumer group ``g`` is the master of ``broker_groups[crc32(g) % n]`` (its first
live slave while it is down); any other node answers 421 ``not_coordinator`` naming the right one,
which we follow. Every heartbeat returns the sorted member list and its *member version*; a new
version asks the consumer to rebalance at once (RocketMQ's "notify consumer ids changed").

The allocation strategy runs here, in the member itself (RocketMQ's way): every member computes the
same global allocation from the same sorted member list and takes its own share. The engine only
sees :meth:`GroupCoordinator.assignment` (mqd.consumer.source.Membership).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import structlog

from mqd.consumer.allocation import Strategy, get_strategy
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import Assignment, GroupSettings
from mqd.sources.mqd_broker.metadata_cache import MetadataCache
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_event
from mqd.wire.client import BrokerClient, BrokerError

log = structlog.get_logger("mqd.consumer.coordinator")

R = TypeVar("R")


class GroupCoordinator:
    """Finds the coordinator, keeps this member alive in the consumer group, tracks the member list
    and computes this member's assignment from it."""

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
        allocation: str = "averagely",
    ) -> None:
        self._client = client
        self._metadata = metadata
        self.group = group
        self.client_id = client_id
        self.topics = list(topics)
        self.heartbeat_interval = heartbeat_interval
        self.session_timeout = session_timeout
        self.request_timeout = request_timeout
        self._allocation = allocation
        self._strategy: Strategy[TopicPartition] = get_strategy(allocation)
        self._on_change = on_members_changed
        self.members: tuple[str, ...] = ()
        self.member_version: int | None = None
        self.coordinator_url: str | None = None
        self.coordinator_id: str | None = None
        self.last_error: str | None = None
        self._not_member_logged = False
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
            version = int(answer["version"])  # the member version
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
        changed = changed or version != self.member_version or members != self.members
        self.members, self.member_version = members, version
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

    # -- the engine's view (mqd.consumer.source.Membership) ---------------------------------------

    @classmethod
    def from_settings(
        cls,
        settings: GroupSettings,
        *,
        client: BrokerClient,
        metadata: MetadataCache,
        on_change: Callable[[], None],
    ) -> GroupCoordinator:
        return cls(
            client=client,
            metadata=metadata,
            group=settings.group,
            client_id=settings.member_id,
            topics=list(settings.topics),
            heartbeat_interval=settings.heartbeat_interval,
            session_timeout=settings.session_timeout,
            on_members_changed=on_change,
            request_timeout=settings.request_timeout,
            allocation=settings.allocation,
        )

    @property
    def coordinator(self) -> str | None:
        return self.coordinator_id

    def assignment(self, partitions: Sequence[TopicPartition]) -> Assignment | None:
        """Our share of ``partitions`` by the allocation strategy over the member list; nothing once
        the session expired; None (and a heartbeat now) while we are not in the member list."""
        if self.session_expired():
            return Assignment(frozenset(), self.member_version, ())
        members = self.members
        if self.client_id not in members:
            if not self._not_member_logged:
                log.warning("not a group member (yet); assignment unchanged", group=self.group)
                self._not_member_logged = True
            self.beat_now()
            return None
        self._not_member_logged = False
        mine = set(self._strategy(self.client_id, members, list(partitions))) & set(partitions)
        return Assignment(frozenset(mine), self.member_version, members)

    def update(self, settings: GroupSettings) -> None:
        strategy = get_strategy(settings.allocation)
        self.heartbeat_interval = settings.heartbeat_interval
        self.session_timeout = settings.session_timeout
        self.request_timeout = settings.request_timeout
        self._strategy = strategy
        if list(settings.topics) != self.topics or settings.allocation != self._allocation:
            self.topics = list(settings.topics)
            self._allocation = settings.allocation
            self.beat_now()

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
