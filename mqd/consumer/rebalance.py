"""RebalanceService: applies "my assignment" to the owned partitions (RocketMQ's RebalanceImpl).

It runs every ``rebalance_interval`` and at once when the membership changes (a new member
version, an expired session), when the subscribed partitions change in the metadata, or after a
config reload. Each round asks the membership for this member's share of the subscribed
partitions, diffs it against what is owned, revokes what is gone (listener first, then the queues,
then a commit of their marks) and assigns what is new with a start position from the caller's hook
(the landing directory is the source of truth), else the offset store, else ``consume_from``; a
position resolved from ``consume_from`` is committed to the offset store (awaited) before the
partition is fetched, so a restart or the next owner continues from it instead of resolving again.

The hook's positions are resolved concurrently, and one that fails (the landing lock of that
partition held past its bound by a frozen process, state unreadable) does not hold back the others:
they are assigned, the failed one is logged, counted and retried in the next round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog

from mqd import metrics
from mqd.backoff import backoff_delay
from mqd.config import ConsumerConfig
from mqd.consumer.errors import ConsumerError
from mqd.consumer.offset_store import OffsetStore
from mqd.consumer.source import Assignment, Cluster, LandedEpoch, Membership, ReleasingMembership, Source
from mqd.consumer.subscription_state import SubscriptionState
from mqd.topic_partition import TopicPartition
from mqd.topic_pattern import subscription
from mqd.waiting import cancel_and_wait, wait_event

log = structlog.get_logger("mqd.consumer")


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a newly owned partition starts: an offset and the log incarnation it belongs to."""

    offset: int
    incarnation: str | None = None  # None: not known (the first fetch answer's is adopted)
    landed: LandedEpoch | None = None  # the last landed record's leader epoch (FetchRequest.landed)


# a bare int is an offset of an unknown incarnation
StartPositionHook = Callable[[TopicPartition], Awaitable[StartPosition | int | None]]

_CONSUME_FROM = {"last": "latest", "first": "earliest", "timestamp": "timestamp"}
# How long the first start-position answer waits for the others before its partitions are assigned.
# The landing's heads are read side by side and answer within milliseconds of each other: taken
# together, the partitions share one offset lookup and go out in the first fetch, instead of a first
# wave whose answers' decoding (numpy's and pyarrow's imports, on the loop) holds the later waves
# back (48 partitions: two thirds of them assigned 0.23 s after the first fetch). A hook that takes
# longer (a landing lock held by a frozen process) holds the others back by this much at most.
GATHER_ANSWERS_S = 0.05


class RebalanceListener(Protocol):
    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        """Called before the revoked partitions' queues are dropped."""

    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        """Called once the new partitions have their start positions."""


@runtime_checkable
class ReleasingListener(Protocol):
    async def on_partitions_released(self, tps: set[TopicPartition]) -> None:
        """After ``on_partitions_revoked`` and before their offsets are committed: until nothing of
        ``tps`` is being published any more (a group that hands them on after the release)."""


@dataclass(frozen=True, slots=True)
class Diff:
    removed: frozenset[TopicPartition]
    added: frozenset[TopicPartition]


def diff(owned: frozenset[TopicPartition], assignment: Assignment) -> Diff:
    """What to revoke and what to assign to go from ``owned`` to ``assignment``."""
    return Diff(owned - assignment.partitions, assignment.partitions - owned)


class RebalanceService:
    """The periodic and membership-triggered rebalance loop, and one rebalance round."""

    def __init__(
        self,
        *,
        config: ConsumerConfig,
        source: Source,
        membership: Membership,
        state: SubscriptionState,
        offsets: OffsetStore,
        choose_pull_node: Callable[[TopicPartition], str | None],
        lookup_offsets: Callable[
            [list[TopicPartition], str, int | None], Awaitable[dict[TopicPartition, int]]
        ],
        start_position: StartPositionHook | None = None,
        listener: RebalanceListener | None = None,
        jitter: float = 0.2,
        on_topics: Callable[[tuple[str, ...]], None] | None = None,
    ) -> None:
        """``on_topics``: called with the concrete subscribed topics whenever they change (the
        membership subscribes to those, never to a pattern)."""
        self.config = config
        self._source = source
        self._membership = membership
        self._state = state
        self._offsets = offsets
        self._choose_pull_node = choose_pull_node
        self._lookup_offsets = lookup_offsets
        self._hook = start_position
        self._listener = listener
        self._jitter = jitter
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._known_tps: tuple[TopicPartition, ...] | None = None
        self._task: asyncio.Task[None] | None = None
        self.closed = False  # stop() began: assign nothing more
        self.rebalances = 0
        self.last_error: str | None = None
        # partitions of this member's share still waiting for a start position (retried each round)
        self.unresolved: frozenset[TopicPartition] = frozenset()
        self._on_topics = on_topics
        self.resolved_topics: tuple[str, ...] = subscription(tuple(config.topics)).names
        self.unmatched_patterns: tuple[str, ...] = ()  # patterns matching no topic (status)
        self.waiting: str | None = None  # why no assignment can be made yet (logged once per reason)
        source.add_metadata_listener(self._on_metadata)

    def request(self) -> None:
        """Rebalance soon (membership or subscription changed)."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None and not self.closed:
            self._task = asyncio.create_task(self._run(), name="mqd-rebalance")

    async def stop(self) -> None:
        self.closed = True
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def topics(self, cluster: Cluster | None) -> tuple[str, ...]:
        """The concrete subscribed topics: ``consumer.topics``' names, and the topics of
        ``cluster`` its ``re:`` patterns match (mqd/topic_pattern.py)."""
        sub = subscription(tuple(self.config.topics))
        return sub.resolve(() if cluster is None else cluster.topics)

    def _resolve(self, cluster: Cluster) -> tuple[str, ...]:
        """``topics(cluster)``; a changed resolution of the patterns goes to the membership (the
        group rebalances on it), a pattern matching nothing is a warning (once per change)."""
        sub = subscription(tuple(self.config.topics))
        topics = sub.resolve(cluster.topics)
        unmatched = sub.unmatched(cluster.topics)
        if unmatched != self.unmatched_patterns:
            if unmatched:
                log.warning("topic patterns match no topic", patterns=list(unmatched))
            self.unmatched_patterns = unmatched
        if topics != self.resolved_topics:
            if sub.patterns:
                log.info(
                    "subscribed topics changed",
                    before=list(self.resolved_topics),
                    after=list(topics),
                    patterns=list(sub.patterns),
                )
            self.resolved_topics = topics
            if self._on_topics is not None:
                self._on_topics(topics)
        return topics

    def _on_metadata(self, cluster: Cluster) -> None:
        tps = tuple(cluster.partitions_for(self._resolve(cluster)))
        if self._known_tps is not None and tps != self._known_tps:
            log.info("subscribed partitions changed", before=len(self._known_tps), after=len(tps))
            self.request()

    async def _run(self) -> None:
        failures = 0
        # not `while True`: even with a lost cancel the loop must end once stop() has begun
        while not self.closed:
            await wait_event(self._wake, self.config.rebalance_interval)
            self._wake.clear()
            try:
                complete = await self.rebalance()
            except Exception as exc:  # keep the loop alive; the next round retries
                log.exception("rebalance failed")
                self.last_error = str(exc)
                complete = False
            if complete:
                failures = 0
                continue
            failures += 1
            cfg = self.config  # read each time: a reload may have changed the backoff
            delay = backoff_delay(
                failures,
                base=cfg.error_backoff_ms / 1000,
                cap=cfg.error_backoff_max_ms / 1000,
                jitter=self._jitter,
            )
            await asyncio.sleep(delay)
            self._wake.set()

    async def rebalance(self) -> bool:
        """Compute the assignment now and apply the difference. Returns False when it could not
        complete (no metadata, not a member yet, start positions unknown)."""
        async with self._lock:
            cluster = self._source.cluster
            if cluster is None:
                self._waiting_for("no cluster metadata yet", self._source.metadata_error)
                return False
            cfg = self.config
            topics = self._resolve(cluster)
            all_tps = cluster.partitions_for(topics)
            self._known_tps = tuple(all_tps)
            missing = sorted(set(subscription(tuple(cfg.topics)).names) - set(cluster.topics))
            if missing:
                log.warning("subscribed topics not in the cluster metadata", topics=missing)
            assignment = self._membership.assignment(all_tps)
            if assignment is None:
                self._waiting_for("not a member of the consumer group yet", self._membership.last_error)
                return False
            self._waiting_for(None, None)
            d = diff(frozenset(self._state.partitions), assignment)
            self.unresolved = d.added  # until _assign resolved them
            complete = True
            if d.removed:
                await self._revoke(set(d.removed))
            if isinstance(self._membership, ReleasingMembership):
                self._membership.released(frozenset(self._state.partitions))
            if d.added:
                complete = await self._assign(set(d.added))
            if d.removed or d.added:
                self.rebalances += 1
                metrics.rebalances.inc()
                log.info(
                    "rebalanced",
                    group=cfg.group,
                    members=list(assignment.members),
                    added=sorted(map(str, d.added)),
                    removed=sorted(map(str, d.removed)),
                    owned=len(self._state.partitions),
                )
            metrics.assigned_partitions.set(len(self._state.partitions))
            if complete:
                self.last_error = None
            return complete

    def _waiting_for(self, reason: str | None, error: str | None) -> None:
        """Log why no assignment can be made yet, once per reason (a start that is not up yet must
        say why in the log, not only in a nested status field)."""
        if reason == self.waiting:
            return
        if reason is None:
            log.info("assignment possible again", was=self.waiting)
        else:
            log.warning("no assignment yet", reason=reason, error=error, group=self.config.group)
        self.waiting = reason

    async def _revoke(self, tps: set[TopicPartition]) -> None:
        if self._listener is not None:
            try:
                self._listener.on_partitions_revoked(set(tps))
            except Exception:
                log.exception("on_partitions_revoked failed")
        for tp in tps:
            self._state.drop(tp)
        # only a membership that hands partitions on after their release waits for it (KIP-848):
        # for the others a revoke must not wait behind a publication (all worker slots taken, a
        # disk that refuses writes), which held every later rebalance of the member
        if isinstance(self._listener, ReleasingListener) and isinstance(
            self._membership, ReleasingMembership
        ):
            try:
                await self._listener.on_partitions_released(set(tps))
            except Exception:
                log.exception("on_partitions_released failed")
        try:
            await self._offsets.persist(tps)
        except ConsumerError as exc:
            log.warning("commit on revoke failed; retried with the next commit", error=str(exc))
        self._offsets.forget(tps)

    async def _assign(self, tps: set[TopicPartition]) -> bool:
        """Assign ``tps``, each as soon as its start position is known. With a start-position hook
        the answers come in one by one: a partition whose hook waits (its landing lock held by a
        frozen process, up to the lock's bound) must not hold back the partitions assigned with it;
        answers that follow the first within ``GATHER_ANSWERS_S`` are assigned with it.
        Returns False when some stay unresolved (the next round, backed off, retries them)."""
        ordered = sorted(tps)
        self.unresolved = frozenset(ordered)
        if self._hook is None:
            return await self._assign_resolved(ordered, {}, {})
        hook = self._hook
        futures = {tp: asyncio.ensure_future(hook(tp)) for tp in ordered}
        waiting: set[asyncio.Future[Any]] = set(futures.values())
        complete = True
        try:
            while waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if waiting:
                    more, waiting = await asyncio.wait(waiting, timeout=GATHER_ANSWERS_S)
                    done |= more
                group = [tp for tp, f in futures.items() if f in done]
                hooked, failed = self._hook_answers({tp: futures[tp] for tp in group})
                if not await self._assign_resolved(group, hooked, failed):
                    complete = False
                if self.closed:
                    return False
        finally:
            for f in waiting:
                f.cancel()
        return complete

    async def _assign_resolved(
        self,
        tps: list[TopicPartition],
        hooked: dict[TopicPartition, StartPosition],
        failed: dict[TopicPartition, str],
    ) -> bool:
        """Resolve the rest of ``tps``'s start positions (offset store, consume_from) and assign
        every partition that has one."""
        try:
            positions, failed = await self._start_positions(tps, hooked, failed)
        except ConsumerError as exc:
            self.last_error = str(exc)
            log.warning("start positions unknown; assignment retried", partitions=len(tps), error=str(exc))
            return False
        if self.closed:
            return False
        assigned = [tp for tp in tps if tp in positions]
        for tp in assigned:
            pos = positions[tp]
            self._state.assign(tp, pos.offset, self._choose_pull_node(tp), pos.incarnation, pos.landed)
        if self._listener is not None and assigned:
            try:
                self._listener.on_partitions_assigned(set(assigned))
            except Exception:
                log.exception("on_partitions_assigned failed")
        self.unresolved = self.unresolved - frozenset(assigned)
        if failed:
            self.last_error = "; ".join(failed.values())
            return False
        return True

    @staticmethod
    def _hook_answers(
        answers: dict[TopicPartition, asyncio.Future[Any]],
    ) -> tuple[dict[TopicPartition, StartPosition], dict[TopicPartition, str]]:
        """The hook's finished answers: a start position, None (the hook has no opinion: the offset
        store and consume_from decide), or a ConsumerError (left out, logged, counted, retried)."""
        out: dict[TopicPartition, StartPosition] = {}
        failed: dict[TopicPartition, str] = {}
        for tp, f in answers.items():
            exc = f.exception()
            if isinstance(exc, ConsumerError):
                failed[tp] = f"{tp}: {exc}"
                metrics.start_position_retries.inc()
                log.warning(
                    "start position not resolved; retried in the next round", tp=str(tp), error=str(exc)
                )
                continue
            if exc is not None:
                raise exc
            ans = f.result()
            if ans is None:
                continue
            pos = ans if isinstance(ans, StartPosition) else StartPosition(ans)
            if isinstance(pos.offset, bool) or not isinstance(pos.offset, int) or pos.offset < 0:
                raise ConsumerError(f"{tp}: start_position hook answered {ans!r}, not an offset >= 0")
            out[tp] = pos
        return out, failed

    async def _start_positions(
        self,
        tps: list[TopicPartition],
        hooked: dict[TopicPartition, StartPosition],
        hook_failed: dict[TopicPartition, str],
    ) -> tuple[dict[TopicPartition, StartPosition], dict[TopicPartition, str]]:
        """Start positions of ``tps`` (the hook's answers first), and the partitions that could not
        be resolved (with why)."""
        out = dict(hooked)
        failed = dict(hook_failed)
        source: dict[str, str] = {str(tp): "hook" for tp in out}
        if out:
            await self._warn_committed_differs(out)
        rest = [tp for tp in tps if tp not in out and tp not in failed]
        durable: dict[TopicPartition, int] = {}  # positions the store must hold before any fetch
        if rest:
            stored = await self._offsets.load(rest)
            for tp in rest:
                # a mark not persisted yet (the store was unreachable at revoke, or at an earlier
                # round's commit of a consume_from position) is ours and newer
                marked = self._offsets.marked(tp)
                if marked is not None and marked > stored.get(tp, -1):
                    stored[tp] = durable[tp] = marked
            out.update((tp, StartPosition(o)) for tp, o in stored.items())
            source.update((str(tp), "offset store") for tp in stored)
            rest = [tp for tp in rest if tp not in out]
        if rest:
            cfg = self.config
            found = await self._lookup_offsets(
                rest, _CONSUME_FROM[cfg.consume_from], cfg.consume_timestamp_ms
            )
            durable.update(found)
            out.update((tp, StartPosition(o)) for tp, o in found.items())
            source.update((str(tp), f"consume_from={cfg.consume_from}") for tp in found)
            if cfg.consume_from != "first" and found:
                await self._log_skipped(found)
        await self._make_durable(durable)
        log.info(
            "start positions",
            positions={str(tp): (out[tp].offset, out[tp].incarnation, source[str(tp)]) for tp in out},
        )
        return out, failed

    async def _log_skipped(self, found: dict[TopicPartition, int]) -> None:
        """A start away from the log start leaves existing records unlanded: say how many, per
        partition, so a user who expected everything (Kafka Connect starts from earliest) sees it
        in the first lines of the log, not in the table days later."""
        try:
            earliest = await self._lookup_offsets(sorted(found), "earliest", None)
        except Exception as exc:  # only a log line depends on it; the assignment goes on
            log.debug("log starts not looked up", error=str(exc))
            return
        skipped = {
            str(tp): off - earliest[tp] for tp, off in sorted(found.items()) if off > earliest.get(tp, off)
        }
        if skipped:
            log.warning(
                "start skips existing records",
                consume_from=self.config.consume_from,
                records=sum(skipped.values()),
                partitions=skipped,
                hint='consume_from = "first" lands everything the log holds',
            )

    async def _warn_committed_differs(self, hooked: dict[TopicPartition, StartPosition]) -> None:
        """The hook's position (the landing: the source of truth) wins over the offset store's. A
        committed offset moved by a tool (``kafka-consumer-groups --reset-offsets``) would be
        ignored without a word; say so, and how to move the position deliberately."""
        if not hooked:
            return
        try:
            stored = await self._offsets.load(sorted(hooked))
        except ConsumerError as exc:
            log.debug("committed offsets not compared with the landing", error=str(exc))
            return
        for tp, pos in sorted(hooked.items()):
            committed = stored.get(tp)
            if committed is not None and committed != pos.offset:
                log.warning(
                    "committed offset differs from the landed position; the landing wins",
                    tp=str(tp),
                    committed=committed,
                    landed=pos.offset,
                    hint="a commit behind after a crash is normal; to move where this partition "
                    "resumes, stop the daemon and run `mqd offsets reset` (a broker-side reset of "
                    "the group's offsets is not followed)",
                )

    async def _make_durable(self, resolved: dict[TopicPartition, int]) -> None:
        """Commit start positions the store does not hold yet before they are fetched: "last" or a
        timestamp resolves to a different offset each time, so a restart or a new owner that
        resolved again would skip what arrived in between (DESIGN: the resolved position is made
        durable before anything after it counts as consumed). Raises when the store refuses:
        the partitions are then not assigned and the next round retries from the same marks."""
        if not resolved:
            return
        for tp, offset in resolved.items():
            self._offsets.mark(tp, offset)
        try:
            await self._offsets.persist(resolved)
        except ConsumerError as exc:
            raise ConsumerError(
                f"cannot commit start positions before fetching: {exc}", retriable=True
            ) from exc
