"""KIP-848, Kafka's consumer group protocol, as the engine's Membership (``consumer.kafka.group_protocol
= "consumer"``), and the group's committed offsets under it.

One request does it all: ConsumerGroupHeartbeat (v1, Kafka 4.0+). The member makes its member id (a
UUID, KIP-1082) once, joins with epoch 0, its subscribed topic names, its rebalance timeout, the
broker's assignor by name (``consumer.kafka.remote_assignor``; none: the broker's default) and, when
static, its instance id. The coordinator runs the assignor and answers with the member epoch, the
heartbeat interval and, when it changed, the member's assignment (topic ids and partitions): only
partitions no other member still owns. The member reconciles it incrementally (``Reconciler``):
partitions to give up are released by the engine first (fetching stopped, in-flight publications
ended, offsets committed: ``released``), and only then does the next heartbeat acknowledge by
naming what the member owns; partitions it gains are free at once. A member's epoch is the engine's
member version. Leaving is epoch -1 (a static member: -2, its partitions wait for its restart).
FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: the member owns nothing, waits for the engine to release
everything, and joins again at epoch 0 with the same member id. Without a successful heartbeat for
``consumer.session_timeout`` the member owns nothing (the broker's own session,
``group.consumer.session.timeout.ms``, 45 s by default, should be the longer of the two).

Offsets: OffsetCommit v9 and OffsetFetch v9 carry the member id and epoch (Kafka answers a
consumer-protocol member's OffsetCommit below v9 UNSUPPORTED_VERSION; measured on 4.4). See
docs/decisions/057-kip848-consumer-group-protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError

from mqd.backoff import Backoff
from mqd.consumer.errors import ConsumerError
from mqd.consumer.offset_store import CoordinatorOffsetStore
from mqd.consumer.source import Assignment, GroupSettings
from mqd.sources.kafka.coordinator import COORDINATION, find_coordinator
from mqd.sources.kafka.protocol_ext import (
    ConsumerGroupHeartbeatRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    fetched_offsets,
    heartbeat_assignment,
)
from mqd.topic_partition import TopicPartition
from mqd.waiting import cancel_and_wait, wait_event

log = structlog.get_logger("mqd.sources.kafka.consumer_group_protocol")

LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2

# error codes of a ConsumerGroupHeartbeat answer (KIP-848) and what the member does about them
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_MOVED = frozenset({15, 16})  # not available, not coordinator: find it again
UNKNOWN_MEMBER_ID = 25
UNSUPPORTED_VERSION = 35
GROUP_MAX_SIZE_REACHED = 81
FENCED_INSTANCE_ID = 82
FENCED_MEMBER_EPOCH = 110
UNRELEASED_INSTANCE_ID = 111
UNSUPPORTED_ASSIGNOR = 112
STALE_MEMBER_EPOCH = 113
NAMES = {
    14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE",
    16: "NOT_COORDINATOR",
    25: "UNKNOWN_MEMBER_ID",
    30: "GROUP_AUTHORIZATION_FAILED",
    35: "UNSUPPORTED_VERSION",
    42: "INVALID_REQUEST",
    69: "GROUP_ID_NOT_FOUND",
    81: "GROUP_MAX_SIZE_REACHED",
    82: "FENCED_INSTANCE_ID",
    110: "FENCED_MEMBER_EPOCH",
    111: "UNRELEASED_INSTANCE_ID",
    112: "UNSUPPORTED_ASSIGNOR",
    113: "STALE_MEMBER_EPOCH",
}

IdPartition = tuple[str, int]  # (topic id, partition): how the coordinator names a partition


def error_name(code: int) -> str:
    return NAMES.get(code, f"error {code}")


class HeartbeatError(ConsumerError):
    """A ConsumerGroupHeartbeat answered an error code."""

    def __init__(self, code: int, message: str | None, *, retriable: bool = True) -> None:
        text = f"consumer group heartbeat: {error_name(code)} ({code})" + (f": {message}" if message else "")
        super().__init__(text, retriable=retriable)
        self.code = code


@dataclass(slots=True)
class Reconciler:
    """The member's side of KIP-848's reconciliation, pure: the coordinator's target (what the
    member may own now, by topic id), what the member acknowledged owning, and what it must
    release before it may acknowledge the target.

    Rules: a new target with nothing to give up is acknowledged at once (the partitions it adds are
    free: the coordinator hands out none another member still owns). A target that takes partitions
    away keeps the old acknowledgement until the engine released every one of them (``released``:
    the engine holds nothing outside a set any more); then the whole target is acknowledged.
    ``lose_all`` (fenced, unknown member, session over): target and acknowledgement empty; the
    engine must release everything before the member joins again."""

    target: frozenset[IdPartition] = frozenset()
    acked: frozenset[IdPartition] = frozenset()
    releasing: frozenset[IdPartition] = frozenset()
    known: bool = False  # a target has been received since the last join

    def new_target(self, target: Iterable[IdPartition]) -> bool:
        """Adopt the coordinator's assignment; True when the acknowledgement changed (send it now)."""
        new = frozenset(target)
        # the engine may hold anything of an earlier target (handed out, acknowledged or not)
        self.releasing = (self.releasing | self.acked | self.target) - new
        self.target, self.known = new, True
        return self._settle()

    def released(self, held: Iterable[IdPartition]) -> bool:
        """The engine holds nothing outside ``held`` (and what it gave up is published and
        committed); True when the acknowledgement changed."""
        self.releasing &= frozenset(held)
        return self._settle()

    def lose_all(self) -> None:
        """Fenced or expired: nothing is ours any more; everything handed out must be released."""
        self.releasing = self.releasing | self.acked | self.target
        self.target, self.acked, self.known = frozenset(), frozenset(), False

    def _settle(self) -> bool:
        if self.releasing or self.acked == self.target:
            return False
        self.acked = self.target
        return True


@dataclass(frozen=True, slots=True)
class Change:
    """One change of what the engine may own, for status and tests."""

    epoch: int
    at: float
    added: frozenset[TopicPartition]
    removed: frozenset[TopicPartition]


class ConsumerProtocolGroup:
    """This member of a KIP-848 consumer group (mqd.consumer.source.Membership)."""

    def __init__(
        self,
        *,
        client: Callable[[], AIOKafkaClient | None],
        topic_ids: Callable[[], Mapping[str, str]],
        request_refresh: Callable[[], None],
        settings: GroupSettings,
        on_change: Callable[[], None],
        instance_id: str | None,
        static: bool,
        remote_assignor: str,
        rack: str | None,
        error_backoff: float,
    ) -> None:
        self._client_of = client
        self._topic_ids = topic_ids
        self._request_refresh = request_refresh
        self._settings = settings
        self._on_change = on_change
        self.instance_id = instance_id
        self.static_id = instance_id if static else None
        self.remote_assignor = remote_assignor or None
        self._rack = rack
        self._backoff = Backoff(error_backoff, 5.0)
        self.member_id = str(uuid.uuid4())  # the member's for the life of this object (KIP-1082)
        self.epoch = 0
        self.rec = Reconciler()
        self.heartbeat_interval = settings.heartbeat_interval
        self.coordinator_id: int | None = None
        self.last_success: float | None = None
        self._last_error: str | None = None
        self._said: str | None = None  # the last configuration error logged (once each)
        self.fenced = False  # another process took our instance id (until stop)
        self._send_now = asyncio.Event()
        self._released = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._given: frozenset[TopicPartition] = frozenset()  # what assignment() handed out last
        self.changes: list[Change] = []  # every change of the handed-out partitions (bounded)

    # -- Membership --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-kafka-consumer-group")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        client = self._client_of()
        if self.epoch > 0 and client is not None and self.coordinator_id is not None:
            leave = STATIC_LEAVE_EPOCH if self.static_id else LEAVE_EPOCH
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(self._settings.request_timeout):
                    resp = await client.send(
                        self.coordinator_id,
                        ConsumerGroupHeartbeatRequest(
                            self._settings.group, self.member_id, leave, instance_id=self.static_id
                        ),
                        group=COORDINATION,
                    )
                    log.info(
                        "left the consumer group",
                        group=self._settings.group,
                        member=self.member_id,
                        epoch=leave,
                        error=error_name(resp.error_code) if resp.error_code else None,
                    )
        self.epoch = 0
        self.rec = Reconciler()
        self.fenced = False

    def assignment(self, partitions: Sequence[TopicPartition]) -> Assignment | None:
        if self.fenced:
            return Assignment(frozenset(), self.epoch, ())
        if not self.rec.known:
            # after a fence or session loss: nothing (the engine releases it) until the next target
            return None if not self._given else self._hand_out(frozenset())
        if self.session_expired():
            return self._hand_out(frozenset())
        names = {i: t for t, i in self._topic_ids().items()}
        mine: set[TopicPartition] = set()
        unknown = False
        for topic_id, p in self.rec.target:
            topic = names.get(topic_id)
            if topic is None:
                unknown = True  # a topic our metadata does not name yet: not ours until it does
            else:
                mine.add(TopicPartition(topic, p))
        if unknown:
            self._request_refresh()
        return self._hand_out(frozenset(mine) & frozenset(partitions))

    def _hand_out(self, mine: frozenset[TopicPartition]) -> Assignment:
        if mine != self._given:
            self.changes.append(Change(self.epoch, time.monotonic(), mine - self._given, self._given - mine))
            del self.changes[:-1000]
            self._given = mine
        return Assignment(mine, self.epoch, (self.instance_id or self.member_id,))

    def released(self, held: frozenset[TopicPartition]) -> None:
        """The engine holds nothing outside ``held`` any more: partitions it gave up are no longer
        fetched, their publications in flight ended and their offsets were committed. The next
        heartbeat may acknowledge a revocation then (at once, not after the interval)."""
        ids = self._topic_ids()
        held_ids = {(ids[tp.topic], tp.partition) for tp in held if tp.topic in ids}
        if self.rec.released(held_ids):
            self._send_now.set()
        if not held:
            self._released.set()

    def update(self, settings: GroupSettings) -> None:
        old, self._settings = self._settings, settings
        if settings.topics != old.topics:
            self._send_now.set()  # the new subscription goes out with the next heartbeat

    @property
    def members(self) -> tuple[str, ...]:
        return (self.instance_id or self.member_id,)  # KIP-848 tells a member no member list

    @property
    def member_version(self) -> int | None:
        return self.epoch if self.rec.known else None

    @property
    def coordinator(self) -> str | None:
        return None if self.coordinator_id is None else str(self.coordinator_id)

    @property
    def last_error(self) -> str | None:
        return self._last_error

    def session_expired(self) -> bool:
        """No heartbeat answered for a session timeout: the coordinator may have given our
        partitions away."""
        return (
            self.last_success is not None
            and time.monotonic() - self.last_success > self._settings.session_timeout
        )

    # -- the protocol ------------------------------------------------------------------------------

    def _client(self) -> AIOKafkaClient:
        client = self._client_of()
        if client is None:
            raise ConsumerError("kafka source not started", retriable=True)
        return client

    async def send(self, request: Any) -> Any:
        """One request to the group's coordinator (found first when unknown), bounded by
        request_timeout."""
        client = self._client()
        timeout = self._settings.request_timeout
        if self.coordinator_id is None:
            code, node = await find_coordinator(client, self._settings.group, timeout)
            if code:
                raise HeartbeatError(code, "find coordinator")
            self.coordinator_id = node
            log.info("group coordinator", group=self._settings.group, node=node)
        async with asyncio.timeout(timeout):
            return await client.send(self.coordinator_id, request, group=COORDINATION)

    def _request(self) -> ConsumerGroupHeartbeatRequest:
        """Every field, every time: the coordinator compares, and a lost answer can never leave it
        with a stale subscription or acknowledgement (KIP-848 lets a client send only changes)."""
        s = self._settings
        owned: dict[str, list[int]] = {}
        for topic_id, p in self.rec.acked:
            owned.setdefault(topic_id, []).append(p)
        return ConsumerGroupHeartbeatRequest(
            s.group,
            self.member_id,
            self.epoch,
            instance_id=self.static_id,
            rack_id=self._rack,
            rebalance_timeout_ms=int(self.rebalance_timeout * 1000),
            topics=sorted(s.topics),
            server_assignor=self.remote_assignor,
            owned=owned,
        )

    @property
    def rebalance_timeout(self) -> float:
        """How long the coordinator waits for this member to release partitions: its session
        timeout plus a request timeout (an in-flight publication ends, offsets commit)."""
        return self._settings.session_timeout + self._settings.request_timeout

    async def _run(self) -> None:
        while self._task is not None:
            try:
                await self._heartbeat()
                self._backoff.reset()
                await wait_event(self._send_now, self.heartbeat_interval)
            except asyncio.CancelledError:
                raise
            except IncompatibleBrokerVersion:
                await self._configuration_error(
                    "the broker does not speak KIP-848's consumer group protocol (no "
                    "ConsumerGroupHeartbeat v1; Apache Kafka 4.0+ does): set "
                    'consumer.kafka.group_protocol = "classic"'
                )
            except HeartbeatError as exc:
                await self._on_error(exc)
            except (ConsumerError, KafkaError, OSError, TimeoutError) as exc:
                self._last_error = str(exc) or type(exc).__name__
                self.coordinator_id = None  # the node is gone or moved: find it again
                delay = self._backoff.next()
                log.warning(
                    "consumer group heartbeat failed",
                    group=self._settings.group,
                    error=self._last_error,
                    backoff=delay,
                )
                await asyncio.sleep(delay)
            except Exception:  # a bug must not end membership for good
                log.exception("consumer group loop failed", group=self._settings.group)
                await asyncio.sleep(self._backoff.next())

    async def _heartbeat(self) -> None:
        self._send_now.clear()
        joined = self.epoch == 0
        resp = await self.send(self._request())
        if resp.error_code:
            raise HeartbeatError(resp.error_code, resp.error_message)
        self.last_success = time.monotonic()
        self._last_error = None
        self._said = None
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_interval = resp.heartbeat_interval_ms / 1000
        changed = resp.member_epoch != self.epoch
        self.epoch = resp.member_epoch
        target = heartbeat_assignment(resp)
        # the broker repeats the assignment in answers to full heartbeats: only a different one is
        # news (a rebalance pass and a log line each heartbeat otherwise)
        ids = [] if target is None else [(t, p) for t, ps in target.items() for p in ps]
        if target is not None and (not self.rec.known or frozenset(ids) != self.rec.target):
            if self.rec.new_target(ids):
                self._send_now.set()  # acknowledge now, not after the interval
            changed = True
            log.info(
                "consumer group assignment",
                group=self._settings.group,
                member=self.member_id,
                epoch=self.epoch,
                partitions=len(ids),
                releasing=len(self.rec.releasing),
            )
        if joined:
            log.info(
                "consumer group joined",
                group=self._settings.group,
                member=self.member_id,
                epoch=self.epoch,
                assignor=self.remote_assignor or "broker default",
                heartbeat_interval=self.heartbeat_interval,
            )
        if changed:
            self._on_change()

    async def _on_error(self, exc: HeartbeatError) -> None:
        code, s = exc.code, self._settings
        self._last_error = str(exc)
        if code in COORDINATOR_MOVED:
            self.coordinator_id = None
        if code in (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID):
            log.warning("consumer group: fenced, rejoining at epoch 0", group=s.group, error=str(exc))
            await self._lose_all()
            return  # rejoin at once
        if code == FENCED_INSTANCE_ID:
            self.fenced = True
            self._last_error = (
                f"fenced: another member of group {s.group!r} uses group_instance_id {self.instance_id!r}; "
                "this daemon owns nothing until it is restarted with its own"
            )
            log.error("consumer group: " + self._last_error)
            self.rec.lose_all()
            self._on_change()
            self._task = None  # stop heartbeating: the other process holds the instance id
            return
        if code == UNSUPPORTED_VERSION:
            await self._configuration_error(
                f"the broker does not speak KIP-848's consumer group protocol ({exc}): set "
                'consumer.kafka.group_protocol = "classic"'
            )
            return
        if code == UNSUPPORTED_ASSIGNOR:
            await self._configuration_error(
                f"the broker refuses consumer.kafka.remote_assignor = {self.remote_assignor!r} ({exc})"
            )
            return
        if code == GROUP_MAX_SIZE_REACHED:
            await self._configuration_error(
                f"consumer group {s.group!r} is full (the broker's group.consumer.max.size): this "
                "daemon owns nothing and retries"
            )
            return
        if code == UNRELEASED_INSTANCE_ID:
            # the instance id's previous member has not left (-2) nor expired yet: wait for it
            self.epoch = 0
        delay = 0.0 if code == STALE_MEMBER_EPOCH else self._backoff.next()
        log.warning("consumer group heartbeat refused", group=s.group, error=str(exc), backoff=delay)
        await asyncio.sleep(delay)

    async def _lose_all(self) -> None:
        """Own nothing, let the engine release everything (bounded: the coordinator already gave it
        away), then join again at epoch 0 under the same member id."""
        self.rec.lose_all()
        self.epoch = 0
        self._released.clear()
        self._on_change()
        if self._given and not await wait_event(self._released, self.rebalance_timeout):
            log.warning("rejoining before the engine released its partitions", group=self._settings.group)

    async def _configuration_error(self, text: str) -> None:
        """A refusal that retrying cannot mend until the configuration or the broker changes: the
        member owns nothing, says so once at error level, and retries at the backoff's cap."""
        self._last_error = text
        if self._said != text:
            self._said = text
            log.error("consumer group: " + text, group=self._settings.group)
        if self.rec.known or self.rec.acked:
            self.rec.lose_all()
            self._on_change()
        self.epoch = 0
        await asyncio.sleep(self._backoff.cap)


class ConsumerProtocolOffsetStore(CoordinatorOffsetStore):
    """Offsets committed on the group's coordinator with the member's id and epoch (OffsetCommit v9,
    OffsetFetch v9)."""

    commit_errors = (ConsumerError, KafkaError, OSError, TimeoutError)

    def __init__(self, group: ConsumerProtocolGroup, settings: GroupSettings) -> None:
        super().__init__()
        self._group = group
        self._name = settings.group
        self.last_commit_epoch: int | None = None  # the member epoch of the last accepted commit

    async def _read_committed(self, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        g = self._group
        try:
            # epoch -1 / no member id: a plain read (the member may not have joined yet)
            joined = g.epoch > 0
            resp = await g.send(
                OffsetFetchRequest(
                    self._name, g.member_id if joined else "", g.epoch if joined else -1, by_topic
                )
            )
        except (KafkaError, OSError, TimeoutError) as exc:
            raise ConsumerError(f"cannot read committed offsets: {exc!r}", retriable=True) from exc
        group_error, rows = fetched_offsets(resp)
        if group_error:
            raise ConsumerError(f"committed offsets: {error_name(group_error)}", retriable=True)
        out = []
        for tp, offset, error_code in rows:
            if error_code:
                raise ConsumerError(f"{tp}: committed offset: {error_name(error_code)}", retriable=True)
            out.append((tp, offset))
        return out

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, off in offsets.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, off))
        g = self._group
        resp = await g.send(OffsetCommitRequest(self._name, g.epoch, g.member_id, g.static_id, by_topic))
        codes = {c for _t, parts, _tags in resp.topics for _p, c, _ptags in parts if c}
        if codes:
            raise ConsumerError(
                f"offset commit refused (member epoch {g.epoch}): "
                + ", ".join(sorted(error_name(c) for c in codes)),
                retriable=True,
            )
        self.last_commit_epoch = g.epoch
