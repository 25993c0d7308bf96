"""The Consumer facade: start/stop order, drain, pause/resume/seek, mark/commit, snapshot.

One asyncio loop owns all of it (DESIGN.md §2). The mechanisms live in their own files: the source
(mqd.consumer.source; the mqd broker by default), the membership (chosen once here: the source's
consumer group, or Broadcast), the RebalanceService, the node fetchers, the SubscriptionState with
its process queues and ByteBudget, and the offset store. The caller (the daemon) drains what is
buffered with ``fetched_batches()``; the fetchers never push.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Any

import structlog

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer.allocation import get_strategy
from mqd.consumer.budget import ByteBudget
from mqd.consumer.errors import ConsumerError
from mqd.consumer.fetcher import FetchManager
from mqd.consumer.log_end_poller import LogEndPoller
from mqd.consumer.membership import Broadcast
from mqd.consumer.memory_gauge import MemoryGauge
from mqd.consumer.offset_store import LocalFileOffsetStore, OffsetStore
from mqd.consumer.process_queue import FetchedBatch, FlowLimits
from mqd.consumer.rebalance import RebalanceListener, RebalanceService, StartPositionHook
from mqd.consumer.snapshot import ConsumerSnapshot, Errors, PartitionSnapshot, Totals, consumer_status_json
from mqd.consumer.source import GroupSettings, Membership, Source
from mqd.consumer.subscription_state import SubscriptionState
from mqd.topic_partition import TopicPartition
from mqd.topic_pattern import subscription
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer")

# settings that only take effect on a restart (update_config warns about them)
_RESTART_ONLY = (
    "group",
    "client_id",
    "bootstrap",
    "mode",
    "offset_file",
    "auth_token",
    "tls_ca_file",
    "request_timeout",
)


def _tp(value: Any) -> TopicPartition:
    """Accept a TopicPartition or a plain (topic, partition) pair; anything else is a clear error."""
    if isinstance(value, TopicPartition):
        return value
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    ):
        return TopicPartition(value[0], value[1])
    raise TypeError(f"expected a TopicPartition (topic, partition), got {value!r}")


def group_settings(cfg: ConsumerConfig, topics: tuple[str, ...] | None = None) -> GroupSettings:
    """``topics``: the concrete subscribed topics (default: the names of ``cfg.topics``; its
    ``re:`` patterns are resolved against the metadata by the rebalance service)."""
    return GroupSettings(
        group=cfg.group,
        member_id=cfg.effective_client_id,
        topics=subscription(tuple(cfg.topics)).names if topics is None else topics,
        allocation=cfg.allocation,
        heartbeat_interval=cfg.heartbeat_interval,
        session_timeout=cfg.session_timeout,
        # a hung coordinator must not make us miss our own session
        request_timeout=min(cfg.request_timeout, max(0.5, cfg.session_timeout / 3)),
    )


def _limits(cfg: ConsumerConfig) -> FlowLimits:
    return FlowLimits(
        max_queued_records=cfg.max_queued_records,
        max_queued_bytes=cfg.max_queued_bytes,
        max_offset_span=cfg.max_offset_span,
        retry_s=cfg.flow_control_retry_ms / 1000,
    )


class Consumer:
    """Pulls the subscribed topics of one consumer group (or every partition, in broadcast mode)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        start_position: StartPositionHook | None = None,
        listener: RebalanceListener | None = None,
        source: Source,
        auto_mark: bool = False,
        budget_held: bool = False,
        memory_gauge: MemoryGauge | None = None,
    ) -> None:
        """``source``: where records come from, built by the caller (``mqd.sources.open_source``:
        the engine names no source implementation); started and stopped with the consumer.
        ``budget_held``: ``max_buffered_bytes`` bounds every fetch answer still in memory, also
        after its batches were drained, until the caller drops them (the daemon: until they are
        published). Otherwise it bounds the batches buffered here, and what was drained is the
        caller's. ``memory_gauge``: the budget also counts the process's RSS above its idle
        baseline beyond its charges, once ``take_memory_baseline`` was called."""
        self._config = config
        self.client_id = config.effective_client_id
        get_strategy(config.allocation)  # unknown name: fail early
        self._auto_mark = auto_mark
        self._source = source
        self._budget = ByteBudget(config.max_buffered_bytes, held=budget_held, gauge=memory_gauge)
        self._state = SubscriptionState(_limits(config), self._budget)
        self._fetch = FetchManager(config=config, source=self._source, state=self._state)
        self._source.add_metadata_listener(self._fetch.on_metadata)
        self._membership: Membership
        self._offsets: OffsetStore
        if config.mode == "cluster":
            group = self._source.consumer_group(group_settings(config), self._request_rebalance)
            self._membership, self._offsets = group.membership, group.offsets
        else:
            self._membership = Broadcast(self.client_id)
            self._offsets = LocalFileOffsetStore(config.offset_file)
        self._fetch.on_rewind = self._offsets.rewind  # a new log incarnation moves the marks back
        self._rebalance = RebalanceService(
            config=config,
            source=self._source,
            membership=self._membership,
            state=self._state,
            offsets=self._offsets,
            choose_pull_node=self._fetch.choose_pull_node,
            lookup_offsets=self._fetch.lookup_offsets,
            start_position=start_position,
            listener=listener,
            on_topics=self._topics_changed,
        )
        self._log_end = LogEndPoller(
            source=self._source,
            state=self._state,
            choose_node=self._fetch.choose_pull_node,
            committed=self._offsets.committed,
            landed=self._offsets.marked,
            interval=config.log_end_interval,
            stuck_intervals=config.stuck_intervals,
            timeout=config.request_timeout,
        )
        self._commit_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    def _request_rebalance(self) -> None:
        self._rebalance.request()

    def _topics_changed(self, topics: tuple[str, ...]) -> None:
        # the group sees concrete topics; a new one matching a pattern rebalances the group
        self._membership.update(group_settings(self._config, topics))

    def subscribed_topics(self) -> tuple[str, ...]:
        """The concrete topics subscribed now (``re:`` patterns resolved against the metadata)."""
        return self._rebalance.topics(self._source.cluster)

    def unmatched_patterns(self) -> tuple[str, ...]:
        """The ``re:`` patterns of ``consumer.topics`` that match no topic (a warning, in status)."""
        return self._rebalance.unmatched_patterns

    def waiting_reason(self) -> str | None:
        """Why no assignment can be made yet (no metadata, not a group member), or None."""
        return self._rebalance.waiting

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, join the group and take the first assignment (positions resolved) before
        returning; raises ConsumerError when no broker answers within ``request_timeout``."""
        if self._started:
            return
        if self._closed:
            raise ConsumerError("a stopped Consumer cannot be started again")
        self._started = True
        try:
            await self._source.start(timeout=self._config.request_timeout)
            await self._offsets.start()
            self._fetch.start()
            await self._membership.start()
            if not await self._rebalance.rebalance():
                self._rebalance.request()
            self._rebalance.start()
            self._commit_task = asyncio.create_task(self._commit_loop(), name="mqd-commit")
            self._log_end.start()
            log.info(
                "consumer started",
                client_id=self.client_id,
                group=self._config.group,
                mode=self._config.mode,
                topics=list(self._config.topics),
                owned=len(self._state.partitions),
            )
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop fetching, persist marked offsets, leave the group; idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._rebalance.stop()
        await self._log_end.stop()
        task, self._commit_task = self._commit_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._fetch.stop()
        if self._started:
            try:
                await self._offsets.persist()
            except ConsumerError as exc:
                log.error("final offset commit failed", error=str(exc))
        await self._membership.stop()
        await self._source.stop()
        await self._offsets.stop()
        self._state.clear()
        metrics.assigned_partitions.set(0)
        log.info("consumer stopped", client_id=self.client_id)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- drain -----------------------------------------------------------------------------------

    def fetched_batches(self, max_bytes: int | None = None) -> list[FetchedBatch]:
        """Buffered batches, oldest first per partition (at least one when any is buffered, even if
        larger than ``max_bytes``). Never blocks."""
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        out = self._state.drain(max_bytes)
        if self._auto_mark:
            for b in out:
                self._offsets.mark(b.tp, b.next_offset)
        return out

    def take_memory_baseline(self) -> None:
        """The daemon holds its code now (the landing encoded once): the memory gauge's baseline
        is the RSS less what the budget charges."""
        if self._budget.gauge is not None:
            self._budget.gauge.start(self._budget.charged())

    def loading_code(self) -> contextlib.AbstractContextManager[None]:
        """Around code loaded after the memory baseline (the admin endpoint's build, on a worker
        thread): what it adds to the RSS is code, not records (MemoryGauge.loading_code)."""
        gauge = self._budget.gauge
        return contextlib.nullcontext() if gauge is None else gauge.loading_code(self._budget.charged)

    def memory_bound(self) -> bool:
        """Fetching is held back by the byte budget (less than one partition's share left, or a
        quarter of a budget smaller than that) while nothing is left to drain: only dropping
        drained batches lets it go on."""
        if self._state.buffered_records:
            return False
        return self.memory_shortfall() > 0

    def memory_shortfall(self) -> int:
        """While memory_bound: the bytes to free before one more fetch fits (at least 1), else 0."""
        if self._state.buffered_records:
            return 0
        budget = self._budget
        low = min(self._config.partition_max_bytes, budget.limit // 4)
        return max(low - budget.left(), 1) if budget.memory_bound(low) else 0

    async def wait_for_data(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until something is buffered; True when it is."""
        if self._state.buffered_records:
            return True
        await wait_event(self._state.data_ready, timeout)
        return self._state.buffered_records > 0

    # -- assignment and positions ----------------------------------------------------------------

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._state.partitions)

    def assignment_epoch(self, tp: TopicPartition) -> int | None:
        """The partition's assignment epoch (changes on every assignment and seek), None if not owned."""
        op = self._state.partitions.get(tp)
        return None if op is None else op.epoch

    def is_owned(self, tp: TopicPartition, epoch: int) -> bool:
        op = self._state.partitions.get(tp)
        return op is not None and op.epoch == epoch

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """Stop fetching ``tps``; an answer already in flight for them is discarded. Partitions not
        owned (any more) are ignored: a rebalance may have revoked them."""
        self._state.set_paused(self._owned(tps), True)

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        self._state.set_paused(self._owned(tps), False)

    def _owned(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        tps = [_tp(tp) for tp in tps]
        unknown = [str(tp) for tp in tps if tp not in self._state.partitions]
        if unknown:
            log.info("pause/resume of partitions not owned ignored", partitions=unknown)
        return [tp for tp in tps if tp in self._state.partitions]

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, op in self._state.partitions.items() if op.paused)

    def seek(self, tp: TopicPartition, offset: int, incarnation: str | None = None) -> None:
        """Fetch ``tp`` from ``offset`` next: its buffered data and in-flight answer are discarded,
        its assignment epoch changes, a parked partition is released. ``incarnation``: the log
        incarnation ``offset`` belongs to (None keeps the partition's: a seek within its log)."""
        tp = _tp(tp)
        op = self._state.get(tp)
        old, old_inc = op.position, op.incarnation
        self._state.seek(tp, offset, incarnation)
        log.info(
            "seek",
            topic=tp.topic,
            partition=tp.partition,
            from_offset=old,
            to_offset=offset,
            from_incarnation=old_inc,
            to_incarnation=op.incarnation,
        )

    def mark_consumed(self, tp: TopicPartition, next_offset: int) -> None:
        """Everything of ``tp`` before ``next_offset`` is handled; forward-only. Persisted every
        commit_interval, on revoke and on stop."""
        self._offsets.mark(_tp(tp), next_offset)

    def note_landed(self, tp: TopicPartition, event_time_ms: int) -> None:
        """The newest event time (ms) among records of ``tp`` just landed: the landing freshness and
        the time lag in status and /metrics."""
        self._log_end.note_landed(_tp(tp), event_time_ms)

    async def commit(self) -> None:
        """Persist marked offsets now; raises ConsumerError (retriable) when the store fails."""
        await self._offsets.persist()

    async def rebalance(self) -> bool:
        """Run one rebalance round now (see RebalanceService.rebalance)."""
        return await self._rebalance.rebalance()

    def partition_count(self, topic: str) -> int | None:
        """Partitions of ``topic`` in the cached metadata (None before the first metadata answer)."""
        cluster = self._source.cluster
        return None if cluster is None else len(cluster.topics.get(topic, ()))

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: op.position for tp, op in self._state.partitions.items()}

    def incarnations(self) -> dict[TopicPartition, str | None]:
        """The log incarnation each owned partition's position belongs to (None: not known yet)."""
        return {tp: op.incarnation for tp, op in self._state.partitions.items()}

    def assignment_resolved(self) -> bool:
        """Every partition of this member's share is assigned (none waits for a start position,
        e.g. behind a landing lock held past its bound)."""
        return not self._rebalance.unresolved

    def caught_up(self) -> bool:
        """Every owned partition (parked ones excepted) was fetched up to its log end and nothing
        is buffered (SubscriptionState.caught_up)."""
        return self._state.caught_up()

    def partition_caught_up(self, tp: TopicPartition) -> bool:
        """``tp`` was fetched up to its log end and none of its records is buffered."""
        return self._state.partition_caught_up(tp)

    # -- config ----------------------------------------------------------------------------------

    def update_config(self, config: ConsumerConfig) -> None:
        """Apply a reloaded config: thresholds, intervals, allocation and topics (-> rebalance)."""
        get_strategy(config.allocation)  # validate before changing anything
        old, self._config = self._config, config
        for key in _RESTART_ONLY:
            if getattr(old, key) != getattr(config, key):
                log.warning("setting changes only on restart", key=key)
        self._state.limits = _limits(config)
        self._budget.limit = config.max_buffered_bytes
        self._fetch.config = config
        self._rebalance.config = config
        self._log_end.interval = config.log_end_interval
        self._log_end.stuck.stuck_intervals = config.stuck_intervals
        self._membership.update(group_settings(config, self._rebalance.topics(self._source.cluster)))
        if list(config.topics) != list(old.topics) or config.allocation != old.allocation:
            self._rebalance.request()
        self._fetch.wake()

    async def _commit_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._config.commit_interval)
            try:
                await self._offsets.persist()
            except ConsumerError as exc:
                log.warning("periodic offset commit failed", error=str(exc))

    # -- status ----------------------------------------------------------------------------------

    def idle_partitions(self) -> list[TopicPartition]:
        """Owned partitions fetched up to their known log end with nothing buffered
        (:meth:`PartitionSnapshot.at_log_end` without building a snapshot: the daemon's housekeeping
        asks every few seconds, over every partition)."""
        return [
            tp
            for tp, op in self._state.partitions.items()
            if op.log_end is not None and op.position >= op.log_end and not op.queue.records
        ]

    def snapshot(self) -> ConsumerSnapshot:
        """The consumer's state now, typed (internal readers use this; JSON is made at the edge)."""
        state, budget, m = self._state, self._budget, self._membership
        now = time.monotonic()
        lag = {tp: self._log_end.view(tp, now) for tp in state.partitions}
        routes = cluster.partitions if (cluster := self._source.cluster) is not None else {}
        partitions = tuple(
            PartitionSnapshot(
                tp=tp,
                epoch=op.epoch,
                position=op.position,
                committed=self._offsets.committed(tp),
                marked=self._offsets.marked(tp),
                log_start=op.log_start,
                log_end=op.log_end,
                pull_node=op.pull_node,
                paused=op.paused,
                in_flight=op.in_flight,
                flow_control=op.queue.held_reason(state.limits),
                buffered_records=op.queue.records,
                buffered_bytes=op.queue.nbytes,
                parked=op.parked,
                last_error=op.last_error,
                last_error_age_s=None if op.last_error_at is None else round(now - op.last_error_at, 3),
                incarnation=op.incarnation,
                incarnation_changes=op.incarnation_changes,
                reused_offsets=op.reused_offsets,
                lost_offsets=op.lost_offsets,
                landed=lag[tp].landed,
                landed_event_time_ms=lag[tp].landed_event_time_ms,
                log_end_age_s=lag[tp].log_end_age_s,
                stalled_polls=lag[tp].stalled_polls,
                stuck=lag[tp].stuck,
                unlanded_since_ms=lag[tp].unlanded_since_ms,
                leader=route.leader if (route := routes.get(tp)) is not None else None,
            )
            for tp, op in sorted(state.partitions.items())
        )
        return ConsumerSnapshot(
            member_id=self.client_id,
            group=self._config.group,
            mode=self._config.mode,
            member_version=m.member_version,
            members=m.members,
            coordinator=m.coordinator,
            allocation=self._config.allocation,
            partitions=partitions,
            totals=Totals(
                owned=len(state.partitions),
                buffered_bytes=budget.buffered,
                buffered_records=state.buffered_records,
                budget_bytes=budget.limit,
                reserved_bytes=budget.reserved,
                pinned_bytes=budget.pinned,
                pinned_bodies=budget.pinned_bodies,
                rebalances=self._rebalance.rebalances,
                offset_resets=self._fetch.offset_resets,
                incarnation_changes=self._fetch.incarnation_changes,
                reused_offsets=self._fetch.reused_offsets,
                lost_offsets=self._fetch.lost_offsets,
                parked=tuple(sorted(str(tp) for tp, op in state.partitions.items() if op.parked)),
                stuck=tuple(sorted(str(tp) for tp, v in lag.items() if v.stuck)),
                memory_outside_bytes=budget.gauge.outside if budget.gauge is not None else 0,
                budget_used_bytes=budget.used(),
            ),
            nodes=self._fetch.snapshot(),
            errors=Errors(
                metadata=self._source.metadata_error,
                heartbeat=m.last_error,
                offset_store=self._offsets.last_error,
                rebalance=self._rebalance.last_error,
            ),
        )

    def status(self) -> dict[str, Any]:
        """The consumer section of the status JSON (consumer_status_json of snapshot())."""
        return consumer_status_json(self.snapshot())
