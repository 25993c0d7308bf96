"""Kafka's consumer-group protocol as the engine's Membership, with mqd's allocation strategies as
the assignor, and the group's committed offsets on its coordinator (KafkaOffsetStore).

FindCoordinator, then JoinGroup / SyncGroup / Heartbeat / LeaveGroup on a connection of their own
(aiokafka's COORDINATION group: a heartbeat never waits behind a long-polling fetch). The elected
leader runs the configured mqd strategy (averagely, consistent-hash, ...) over the sorted member
names and hands every member its share in SyncGroup; the protocol name is "mqd-<strategy>", so a
member with another strategy cannot join the same generation. Each member's subscription names what
it owns and in which generation, so the ``sticky`` strategy keeps every partition where it is unless
balance needs it elsewhere (a claim from an older generation than the newest claimed is stale and
ignored, as in Kafka's cooperative sticky assignor). ``group_instance_id`` is the member's stable
name: it rides in the subscription's user data and the strategy sees it instead of the broker-made
member id, so a restarted daemon gets the same share back. With ``static_membership`` it is also
KIP-345's static member id: JoinGroup and SyncGroup carry it, and a stopping static member does not
leave, so a daemon restarted within ``session_timeout`` takes its place again without the group
re-forming (the others keep what they own; its own partitions wait for it, Kafka's trade). Off by
default: Tansu 0.6 can keep a stopped static member for good, its partitions unconsumed (measured:
a static member that joined after another had expired was never expired itself). A coordinator that
answers FENCED_INSTANCE_ID (another live process joined with this instance id: a configuration
error) makes this member stop rejoining, own nothing and say so, rather than fence the other in
turn. Offsets are committed with the generation and member id, after publication (the engine's
commit loop); the landing stays the source of truth on restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.protocol.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    MemberAssignment,
    ProtocolMetadata,
    SyncGroupRequest,
)

from mqd.backoff import Backoff
from mqd.consumer.allocation import allocate_group, get_strategy
from mqd.consumer.errors import ConsumerError
from mqd.consumer.offset_store import CoordinatorOffsetStore
from mqd.consumer.source import Assignment, Cluster, GroupSettings
from mqd.sources.kafka.coordinator import COORDINATION, find_coordinator
from mqd.topic_partition import TopicPartition
from mqd.waiting import cancel_and_wait, wait_event

log = structlog.get_logger("mqd.sources.kafka.group")

# error codes the loop acts on (the rest: log, back off, start over)
REBALANCE_IN_PROGRESS = 27
UNKNOWN_MEMBER_ID = 25
ILLEGAL_GENERATION = 22
MEMBER_ID_REQUIRED = 79
COORDINATOR_ERRORS = frozenset({14, 15, 16})  # load in progress, not available, not coordinator
FENCED_INSTANCE_ID = 82
INVALID_SESSION_TIMEOUT = 26  # outside the broker's group.min/max.session.timeout.ms
# a JoinGroup or SyncGroup is waited for this much longer than other coordinator requests: the
# coordinator holds them during a rebalance (Kafka up to the group's rebalance timeout, the largest
# of its members'; Tansu a JoinGroup for half the group's session and a SyncGroup for up to 0.8 of
# it, in 1 s steps that each write the group to its storage). Kafka's Java consumer waits its
# rebalance timeout + 5 s. Given up sooner, the request goes on in the coordinator, which serves a
# connection one request at a time, so the rejoin waits behind it and is given up too (issue 14).
REBALANCE_LAPSE = 5.0


class GroupError(ConsumerError):
    """A group request answered an error code."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what}: {for_code(code).__name__} ({code})", retriable=True)
        self.code = code


@dataclass(frozen=True, slots=True)
class MemberClaim:
    """A member's subscription user data: its stable name ("" for none), the generation it last
    synced in (None: none yet) and the partitions it owns in it. JSON, since only mqd members join a
    ``mqd-<strategy>`` protocol; an older mqd sent its bare name, which still decodes."""

    name: str
    generation: int | None
    owned: frozenset[TopicPartition]

    def encode(self) -> bytes:
        topics: dict[str, list[int]] = {}
        for tp in sorted(self.owned):
            topics.setdefault(tp.topic, []).append(tp.partition)
        doc = {"name": self.name, "generation": self.generation, "owned": topics}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> MemberClaim:
        text = (raw or b"").decode("utf-8", "replace")
        try:
            doc = json.loads(text) if text.startswith("{") else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(text, None, frozenset())
        generation = doc.get("generation")
        owned: set[TopicPartition] = set()
        topics = doc.get("owned")
        if isinstance(topics, dict):
            for topic, ps in topics.items():
                if isinstance(ps, list):
                    owned.update(TopicPartition(str(topic), p) for p in ps if type(p) is int)
        return cls(
            str(doc.get("name") or ""),
            generation if type(generation) is int else None,
            frozenset(owned),
        )


class KafkaGroup:
    """This member of a Kafka consumer group (mqd.consumer.source.Membership)."""

    def __init__(
        self,
        *,
        client: Callable[[], AIOKafkaClient | None],
        cluster: Callable[[], Cluster | None],
        settings: GroupSettings,
        on_change: Callable[[], None],
        instance_id: str | None,
        error_backoff: float,
        static: bool = False,
    ) -> None:
        self._client_of = client
        self._cluster_of = cluster
        self._on_change = on_change
        self.instance_id = instance_id
        # KIP-345: the broker knows the member by instance_id (JoinGroup/SyncGroup carry it) and a
        # stop does not leave
        self.static_id = instance_id if static else None
        self._settings = settings
        get_strategy(settings.allocation)  # an unknown name fails here, not at the first join
        self._backoff = Backoff(error_backoff, 5.0)
        self.member_id = ""
        self.generation: int | None = None
        self._members: tuple[str, ...] = ()
        self._assigned: frozenset[TopicPartition] | None = None
        self.coordinator_id: int | None = None
        self._last_error: str | None = None
        self.last_success: float | None = None
        self._rejoin = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_generation = False  # joined and synced; False from a rejoin's start to its end
        self.fenced = False  # another member took our group_instance_id (until stop)
        self._refused_session: float | None = None  # the session_timeout a JoinGroup was refused for
        self._rejoined_as_known = False  # a static member rejoining under its old member id

    # -- Membership --------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-kafka-group")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        client = self._client_of()
        # a member leaves (the others rebalance now, not after a session timeout), except a static
        # one (its restart takes its place back) and while the group re-forms: Tansu keeps a leader
        # that leaves then as the leader, and the group never forms again until Tansu restarts
        # (docs/decisions/045-kafka-chaos-run-tansu.md); the coordinator drops a member that left
        # silently after its session
        if self.static_id and self.member_id:
            log.info(
                "static member: not leaving; the group keeps its partitions for it until its session ends",
                group=self._settings.group,
                group_instance_id=self.static_id,
                session_timeout=self._settings.session_timeout,
            )
        elif self.member_id and client is not None and self.coordinator_id is not None:
            group, coordinator = self._settings.group, self.coordinator_id
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                async with asyncio.timeout(self._settings.request_timeout):
                    if await self._stable(client, coordinator):
                        await client.send(
                            coordinator, LeaveGroupRequest(group, self.member_id), group=COORDINATION
                        )
                        log.info("left the group", group=group, member=self.member_id)
                    else:
                        log.info(
                            "not leaving while the group re-forms: the coordinator drops this member "
                            "after its session",
                            group=group,
                            member=self.member_id,
                            session_timeout=self._settings.session_timeout,
                        )
        self.member_id, self.generation, self._assigned = "", None, None
        self._in_generation = False
        self.fenced = False
        self._rejoined_as_known = False

    async def _stable(self, client: AIOKafkaClient, coordinator: int) -> bool:
        """This member is in a generation the coordinator still runs (a heartbeat says so)."""
        if not self._in_generation or self.generation is None:
            return False
        resp = await client.send(
            coordinator,
            HeartbeatRequest(self._settings.group, self.generation, self.member_id),
            group=COORDINATION,
        )
        return not resp.error_code

    def assignment(self, partitions: Sequence[TopicPartition]) -> Assignment | None:
        if self.fenced:
            return Assignment(frozenset(), self.generation or 0, ())
        if self._assigned is None or self.generation is None:
            return None
        if self.session_expired():
            return Assignment(frozenset(), self.generation, ())
        return Assignment(self._assigned & frozenset(partitions), self.generation, self._members)

    def update(self, settings: GroupSettings) -> None:
        old, self._settings = self._settings, settings
        if (settings.topics, settings.allocation) != (old.topics, old.allocation):
            get_strategy(settings.allocation)
            self._rejoin.set()

    @property
    def members(self) -> tuple[str, ...]:
        return self._members

    @property
    def member_version(self) -> int | None:
        return self.generation

    @property
    def coordinator(self) -> str | None:
        return None if self.coordinator_id is None else str(self.coordinator_id)

    @property
    def last_error(self) -> str | None:
        return self._last_error

    def session_expired(self) -> bool:
        """No heartbeat answered for a session timeout: the group has given our partitions away."""
        return (
            self.last_success is not None
            and time.monotonic() - self.last_success > self._settings.session_timeout
        )

    # -- the protocol --------------------------------------------------------------------------------

    def _client(self) -> AIOKafkaClient:
        client = self._client_of()
        if client is None:
            raise ConsumerError("kafka source not started", retriable=True)
        return client

    async def send(self, request: Any, *, held: bool = False) -> Any:
        """One request to the coordinator (found first when unknown), bounded by request_timeout +
        session_timeout, and REBALANCE_LAPSE more if the coordinator may ``held`` it (join, sync)."""
        client = self._client()
        if self.coordinator_id is None:
            code, node = await find_coordinator(client, self._settings.group, self._settings.request_timeout)
            if code:
                raise GroupError("find coordinator", code)
            self.coordinator_id = node
            log.info("group coordinator", group=self._settings.group, node=node)
        bound = self._settings.request_timeout + self._settings.session_timeout
        async with asyncio.timeout(bound + (REBALANCE_LAPSE if held else 0.0)):
            return await client.send(self.coordinator_id, request, group=COORDINATION)

    async def _run(self) -> None:
        while self._task is not None:
            try:
                await self._join()
                self._backoff.reset()
                await self._heartbeats()
            except asyncio.CancelledError:
                raise
            except (ConsumerError, KafkaError, OSError, TimeoutError) as exc:
                self._in_generation = False
                code = exc.code if isinstance(exc, GroupError) else None
                self._last_error = str(exc) or type(exc).__name__
                if code in COORDINATOR_ERRORS or not isinstance(exc, GroupError):
                    self.coordinator_id = None  # find it again (it moved, or the node is gone)
                if code == FENCED_INSTANCE_ID:
                    self._fenced()
                    return
                if code == INVALID_SESSION_TIMEOUT:
                    await asyncio.sleep(self._session_refused())
                    continue
                if code == UNKNOWN_MEMBER_ID:
                    self._unknown_member()
                if code == REBALANCE_IN_PROGRESS:
                    # the coordinator still knows us: a slow rebalance is no expired session
                    self.last_success = time.monotonic()
                delay = 0.0 if code == REBALANCE_IN_PROGRESS else self._backoff.next()
                log.warning(
                    "consumer group: rejoining",
                    group=self._settings.group,
                    error=self._last_error,
                    backoff=delay,
                )
                await asyncio.sleep(delay)
            except Exception:  # a bug must not end membership for good
                log.exception("consumer group loop failed", group=self._settings.group)
                await asyncio.sleep(self._backoff.next())

    def _unknown_member(self) -> None:
        """UNKNOWN_MEMBER_ID: join again as a new member, except a static member the first time.
        Its heartbeat (v1) names no instance id, so a coordinator that gave our instance id to
        another live process answers UNKNOWN_MEMBER_ID, not FENCED_INSTANCE_ID; joining as a new
        member would take the instance id back, the other would do the same, and the two replaced
        each other for good (Apache Kafka; found by the twins test). One rejoin under the old member
        id lets Kafka tell: FENCED_INSTANCE_ID when another process holds the instance id,
        UNKNOWN_MEMBER_ID again when the group dropped us (our session ended): then as new."""
        if self.static_id and self.member_id and not self._rejoined_as_known:
            self._rejoined_as_known = True
            return
        self.member_id = ""
        self._rejoined_as_known = False

    def _fenced(self) -> None:
        self.fenced, self._assigned, self.member_id = True, frozenset(), ""
        self._last_error = (
            f"fenced: another member of group {self._settings.group!r} uses group_instance_id "
            f"{self.instance_id!r}; this daemon owns nothing until it is restarted with its own"
        )
        log.error("consumer group: " + self._last_error)
        self._on_change()

    def _session_refused(self) -> float:
        """A JoinGroup refused for our session timeout: a configuration error that retrying cannot
        mend until the broker's bounds or consumer.session_timeout change (a reload). Said once as an
        error naming both settings (Kafka's floor is 6 s: a second-long session of a test setup is
        refused there, Tansu takes any); the join is retried at the backoff's cap. The delay."""
        s = self._settings
        self._last_error = (
            f"join group: the broker refuses consumer.session_timeout = {s.session_timeout:g}s: it "
            "must lie within the broker's group.min.session.timeout.ms and "
            "group.max.session.timeout.ms (Kafka's defaults: 6 s and 30 min); this daemon owns "
            "nothing in the group meanwhile"
        )
        if self._refused_session != s.session_timeout:
            self._refused_session = s.session_timeout
            log.error("consumer group: " + self._last_error, group=s.group)
        return self._backoff.cap

    async def _join(self) -> None:
        s = self._settings
        self._rejoin.clear()
        self._in_generation = False
        protocol = f"mqd-{s.allocation}"
        # the stable name and what this member owns ride in the subscription's user data
        owned = self._assigned if self._assigned is not None and not self.session_expired() else ()
        claim = MemberClaim(self.instance_id or "", self.generation, frozenset(owned))
        meta = ProtocolMetadata(0, sorted(s.topics), claim.encode()).encode()
        session_ms = int(s.session_timeout * 1000)
        for _ in range(2):  # the second try carries the member id a MEMBER_ID_REQUIRED answer named
            resp = await self.send(
                JoinGroupRequest(
                    s.group,
                    session_ms,
                    session_ms,
                    self.member_id,
                    self.static_id,  # KIP-345 (JoinGroup v5+)
                    "consumer",
                    [(protocol, meta)],
                ),
                held=True,
            )
            if resp.error_code == MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            break
        if resp.error_code:
            raise GroupError("join group", resp.error_code)
        self.member_id = resp.member_id
        self.last_success = time.monotonic()
        generation = resp.generation_id
        assignments: list[tuple[str, bytes]] = []
        names: tuple[str, ...] = ()
        if resp.leader_id == resp.member_id:
            assignments, names = self._assign(resp.members)
        sync = await self.send(
            SyncGroupRequest(s.group, generation, self.member_id, self.static_id, assignments),
            held=True,
        )
        if sync.error_code:
            raise GroupError("sync group", sync.error_code)
        mine: set[TopicPartition] = set()
        if sync.member_assignment:
            for topic, parts in MemberAssignment.decode(sync.member_assignment).assignment:
                mine.update(TopicPartition(topic, p) for p in parts)
        self.generation = generation
        self._in_generation = True
        self._members = names or (self.instance_id or self.member_id,)
        self._assigned = frozenset(mine)
        self.last_success = time.monotonic()
        self._last_error = None
        self._refused_session = None
        self._rejoined_as_known = False
        log.info(
            "consumer group joined",
            group=s.group,
            generation=generation,
            member=self.member_id,
            leader=resp.leader_id == resp.member_id,
            partitions=len(mine),
        )
        self._on_change()

    def _assign(self, members: Iterable[Any]) -> tuple[list[tuple[str, bytes]], tuple[str, ...]]:
        """The leader's job: every member's share by the mqd strategy over the sorted member names
        (their group_instance_id where set), from this member's metadata of the subscribed topics,
        and for ``sticky`` from what each member owns in the newest generation any of them names."""
        topics: set[str] = set()
        name_of: dict[str, str] = {}
        claims: dict[str, MemberClaim] = {}
        for m in members:
            member_id, meta = m[0], ProtocolMetadata.decode(m[-1])
            claim = MemberClaim.decode(meta.user_data)
            name = claim.name
            if name in name_of.values():
                log.warning("two members share one group_instance_id; one uses its member id", name=name)
                name = ""
            name_of[member_id] = name or member_id
            claims[name or member_id] = claim
            topics.update(meta.subscription)
        cluster = self._cluster_of()
        partitions = cluster.partitions_for(topics) if cluster is not None else []
        names = sorted(name_of.values())
        newest = max((c.generation for c in claims.values() if c.generation is not None), default=None)
        owned = {n: c.owned for n, c in claims.items() if c.generation == newest and newest is not None}
        shares = allocate_group(self._settings.allocation, names, partitions, owned)
        out = []
        for member_id, name in name_of.items():
            share: dict[str, list[int]] = {}
            for tp in shares.get(name, ()):
                share.setdefault(tp.topic, []).append(tp.partition)
            out.append((member_id, MemberAssignment(0, sorted(share.items()), b"").encode()))
        stale = sorted(n for n, c in claims.items() if c.owned and c.generation != newest)
        if stale:
            log.info("ignoring what members owned in an older generation", members=stale, newest=newest)
        return out, tuple(names)

    async def _heartbeats(self) -> None:
        """Until the group rebalances (or settings changed): raises GroupError to rejoin."""
        s = self._settings
        while self._task is not None:
            if await wait_event(self._rejoin, s.heartbeat_interval):
                return
            assert self.generation is not None
            # v1 (aiokafka's): a v3 heartbeat naming the instance made Tansu 0.6 re-form the group
            # without end after a static member's restart (measured, docs/decisions/023-kafka-source.md)
            resp = await self.send(HeartbeatRequest(s.group, self.generation, self.member_id))
            if resp.error_code:
                raise GroupError("heartbeat", resp.error_code)
            self.last_success = time.monotonic()


class KafkaOffsetStore(CoordinatorOffsetStore):
    """Cluster mode: offsets committed on the group's coordinator with its generation and member id."""

    commit_errors = (ConsumerError, KafkaError, OSError, TimeoutError)

    def __init__(self, group: KafkaGroup, settings: GroupSettings) -> None:
        super().__init__()
        self._group = group
        self._name = settings.group

    async def _read_committed(self, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        try:
            resp = await self._group.send(OffsetFetchRequest(self._name, sorted(by_topic.items())))
        except (KafkaError, OSError, TimeoutError) as exc:
            raise ConsumerError(f"cannot read committed offsets: {exc!r}", retriable=True) from exc
        out = []
        for topic, parts in resp.topics:
            for partition, offset, _meta, error_code in parts:
                tp = TopicPartition(topic, partition)
                if error_code:
                    raise ConsumerError(
                        f"{tp}: committed offset: {for_code(error_code).__name__}", retriable=True
                    )
                out.append((tp, offset))
        return out

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        by_topic: dict[str, list[tuple[int, int, str]]] = {}
        for tp, off in offsets.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, off, ""))
        g = self._group
        generation = g.generation if g.generation is not None else -1
        resp = await g.send(
            OffsetCommitRequest(self._name, generation, g.member_id, -1, sorted(by_topic.items()))
        )
        codes = {c for _t, parts in resp.topics for _p, c in parts if c}
        if codes:
            raise ConsumerError(
                "offset commit refused: " + ", ".join(sorted(for_code(c).__name__ for c in codes)),
                retriable=True,
            )
