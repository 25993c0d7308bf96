"""The Consumer facade: metadata, membership, rebalance, node fetchers, offsets, drain.

One asyncio loop owns all of it (DESIGN.md §2). The caller (the daemon) drains what is buffered with
``fetched_batches()``; the fetchers never push. Start positions of newly assigned partitions come
from the caller's ``start_position`` hook first (the landing directory is the source of truth), then
from the offset store, then from ``consume_from``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import structlog

from mqd import metrics
from mqd.client import BrokerClient, BrokerError
from mqd.config import ConsumerConfig
from mqd.consumer.allocation import Strategy, get_strategy
from mqd.consumer.coordinator import GroupCoordinator
from mqd.consumer.fetcher import FetchManager, backoff_delay
from mqd.consumer.metadata import ClusterMetadata, MetadataCache
from mqd.consumer.offsets import BrokerOffsetStore, LocalFileOffsetStore, OffsetStore
from mqd.consumer.state import (
    ConsumerError,
    FetchedBatch,
    FlowLimits,
    SubscriptionState,
    TopicPartition,
)
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer")


class RebalanceListener(Protocol):
    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        """Called before the revoked partitions' queues are dropped."""

    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        """Called once the new partitions have their start positions."""


StartPositionHook = Callable[[TopicPartition], Awaitable[int | None]]

_CONSUME_FROM = {"last": "latest", "first": "earliest", "timestamp": "timestamp"}
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


def _coordinator_timeout(cfg: ConsumerConfig) -> float:
    # a hung coordinator must not make us miss our own session
    return min(cfg.request_timeout, max(0.5, cfg.session_timeout / 3))


def _limits(cfg: ConsumerConfig) -> FlowLimits:
    return FlowLimits(
        max_queued_records=cfg.max_queued_records,
        max_queued_bytes=cfg.max_queued_bytes,
        max_offset_span=cfg.max_offset_span,
        retry_s=cfg.flow_control_retry_ms / 1000,
        max_buffered_bytes=cfg.max_buffered_bytes,
    )


class Consumer:
    """Pulls the subscribed topics of one consumer group (or every partition, in broadcast mode)."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        start_position: StartPositionHook | None = None,
        listener: RebalanceListener | None = None,
        client: BrokerClient | None = None,
        auto_mark: bool = False,
        budget_held: bool = False,
    ) -> None:
        """``budget_held``: ``max_buffered_bytes`` bounds every fetch answer still in memory, also
        after its batches were drained, until the caller drops them (the daemon: until they are
        published). Otherwise it bounds the batches buffered here, and what was drained is the
        caller's."""
        self._config = config
        self.client_id = config.effective_client_id
        self._strategy: Strategy = get_strategy(config.allocation)  # unknown name: fail early
        self._hook = start_position
        self._listener = listener
        self._auto_mark = auto_mark
        self._own_client = client is None
        self._client = client or BrokerClient(
            request_timeout=config.request_timeout,
            auth_token=config.auth_token,
            ca_file=config.tls_ca_file,
        )
        self._state = SubscriptionState(_limits(config), budget_held=budget_held)
        self._metadata = MetadataCache(
            self._client,
            config.bootstrap,
            refresh_interval=config.metadata_refresh_interval,
            error_backoff=config.error_backoff_ms / 1000,
            request_timeout=min(config.request_timeout, 5.0),
        )
        self._fetch = FetchManager(
            config=config,
            client=self._client,
            state=self._state,
            metadata=self._metadata,
            client_id=self.client_id,
        )
        self._metadata.add_listener(self._fetch.on_metadata)
        self._metadata.add_listener(self._on_metadata)
        self._coordinator: GroupCoordinator | None = None
        self._offsets: OffsetStore
        if config.mode == "cluster":
            self._coordinator = GroupCoordinator(
                client=self._client,
                metadata=self._metadata,
                group=config.group,
                client_id=self.client_id,
                topics=list(config.topics),
                heartbeat_interval=config.heartbeat_interval,
                session_timeout=config.session_timeout,
                on_members_changed=self._request_rebalance,
                request_timeout=_coordinator_timeout(config),
            )
            self._offsets = BrokerOffsetStore(self._client, self._coordinator)
        else:
            self._offsets = LocalFileOffsetStore(config.offset_file)
        self._rebalance_wake = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._known_tps: tuple[TopicPartition, ...] | None = None
        self._started = False
        self._closed = False
        self.rebalances = 0
        self.last_rebalance_error: str | None = None
        self._not_member_logged = False

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
            if self._own_client:
                await self._client.start()
            await self._offsets.start()
            self._fetch.start()
            await self._metadata.start(timeout=self._config.request_timeout)
            if self._coordinator is not None:
                await self._coordinator.start()
            if not await self.rebalance():
                self._request_rebalance()
            self._tasks = [
                asyncio.create_task(self._rebalance_loop(), name="mqd-rebalance"),
                asyncio.create_task(self._commit_loop(), name="mqd-commit"),
            ]
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
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self._fetch.stop()
        if self._started:
            try:
                await self._offsets.persist()
            except ConsumerError as exc:
                log.error("final offset commit failed", error=str(exc))
        if self._coordinator is not None:
            await self._coordinator.stop(leave=True)
        await self._metadata.stop()
        await self._offsets.stop()
        self._state.clear()
        metrics.assigned_partitions.set(0)
        if self._own_client:
            await self._client.close()
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

    def memory_bound(self) -> bool:
        """Fetching is held back by the byte budget (less than one partition's share left, or a
        quarter of a budget smaller than that) while nothing is left to drain: only dropping
        drained batches lets it go on."""
        state = self._state
        if state.buffered_records:
            return False
        low = min(self._config.partition_max_bytes, state.limits.max_buffered_bytes // 4)
        return state.budget_blocked or state.budget_left() < low

    async def wait_for_data(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until something is buffered; True when it is."""
        if self._state.buffered_records:
            return True
        await wait_event(self._state.data_ready, timeout)
        return self._state.buffered_records > 0

    # -- assignment and positions ----------------------------------------------------------------

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._state.partitions)

    def generation(self, tp: TopicPartition) -> int | None:
        ps = self._state.partitions.get(tp)
        return None if ps is None else ps.generation

    def is_owned(self, tp: TopicPartition, generation: int) -> bool:
        ps = self._state.partitions.get(tp)
        return ps is not None and ps.generation == generation

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
        return frozenset(tp for tp, ps in self._state.partitions.items() if ps.paused)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next: its buffered data and in-flight answer are discarded,
        its generation changes, a parked partition is released."""
        tp = _tp(tp)
        old = self._state.get(tp).position
        self._state.seek(tp, offset)
        log.info("seek", topic=tp.topic, partition=tp.partition, from_offset=old, to_offset=offset)

    def mark_consumed(self, tp: TopicPartition, next_offset: int) -> None:
        """Everything of ``tp`` before ``next_offset`` is handled; forward-only. Persisted every
        commit_interval, on revoke and on stop."""
        self._offsets.mark(_tp(tp), next_offset)

    async def commit(self) -> None:
        """Persist marked offsets now; raises ConsumerError (retriable) when the store fails."""
        await self._offsets.persist()

    def partition_count(self, topic: str) -> int | None:
        """Partitions of ``topic`` in the cached metadata (None before the first metadata answer)."""
        md = self._metadata.current
        return None if md is None else len(md.topics.get(topic, ()))

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: ps.position for tp, ps in self._state.partitions.items()}

    def caught_up(self) -> bool:
        """Every owned partition (parked ones excepted) was fetched up to the last known log end and
        nothing is buffered."""
        if self._state.buffered_records:
            return False
        for ps in self._state.partitions.values():
            if ps.parked:
                continue
            if ps.log_end is None or ps.position < ps.log_end:
                return False
        return True

    # -- config ----------------------------------------------------------------------------------

    def update_config(self, config: ConsumerConfig) -> None:
        """Apply a reloaded config: thresholds, intervals, allocation and topics (-> rebalance)."""
        strategy = get_strategy(config.allocation)  # validate before changing anything
        old, self._config = self._config, config
        for key in _RESTART_ONLY:
            if getattr(old, key) != getattr(config, key):
                log.warning("setting changes only on restart", key=key)
        self._strategy = strategy
        self._state.limits = _limits(config)
        self._fetch.config = config
        if self._coordinator is not None:
            self._coordinator.heartbeat_interval = config.heartbeat_interval
            self._coordinator.session_timeout = config.session_timeout
            self._coordinator.request_timeout = _coordinator_timeout(config)
        if list(config.topics) != list(old.topics) or config.allocation != old.allocation:
            if self._coordinator is not None:
                self._coordinator.topics = list(config.topics)
                self._coordinator.beat_now()
            self._request_rebalance()
        self._fetch.wake()

    # -- rebalance -------------------------------------------------------------------------------

    def _request_rebalance(self) -> None:
        self._rebalance_wake.set()

    def _on_metadata(self, md: ClusterMetadata) -> None:
        tps = tuple(md.partitions_for(self._config.topics))
        if self._known_tps is not None and tps != self._known_tps:
            log.info("subscribed partitions changed", before=len(self._known_tps), after=len(tps))
            self._request_rebalance()

    async def _rebalance_loop(self) -> None:
        failures = 0
        # not `while True`: even with a lost cancel the loop must end once stop() has begun
        while not self._closed:
            await wait_event(self._rebalance_wake, self._config.rebalance_interval)
            self._rebalance_wake.clear()
            try:
                complete = await self.rebalance()
            except Exception as exc:  # keep the loop alive; the next round retries
                log.exception("rebalance failed")
                self.last_rebalance_error = str(exc)
                complete = False
            if complete:
                failures = 0
                continue
            failures += 1
            await asyncio.sleep(backoff_delay(self._config, failures))
            self._rebalance_wake.set()

    async def rebalance(self) -> bool:
        """Compute the assignment now and apply the difference (RocketMQ RebalanceImpl). Returns
        False when it could not complete (no metadata, not a member yet, start positions unknown)."""
        async with self._rebalance_lock:
            md = self._metadata.current
            if md is None:
                return False
            cfg = self._config
            all_tps = md.partitions_for(cfg.topics)
            self._known_tps = tuple(all_tps)
            missing = sorted(set(cfg.topics) - set(md.topics))
            if missing:
                log.warning("subscribed topics not in the cluster metadata", topics=missing)
            members: tuple[str, ...] = ()
            if self._coordinator is None:
                target = set(all_tps)
            elif self._coordinator.session_expired():
                target = set()
            else:
                members = self._coordinator.members
                if self.client_id not in members:
                    if not self._not_member_logged:
                        log.warning("not a group member (yet); assignment unchanged", group=cfg.group)
                        self._not_member_logged = True
                    self._coordinator.beat_now()
                    return False
                self._not_member_logged = False
                target = set(self._strategy(self.client_id, members, all_tps)) & set(all_tps)
            owned = set(self._state.partitions)
            removed, added = owned - target, target - owned
            complete = True
            if removed:
                await self._revoke(removed)
            if added:
                complete = await self._assign(added)
            if removed or added:
                self.rebalances += 1
                metrics.rebalances.inc()
                log.info(
                    "rebalanced",
                    group=cfg.group,
                    members=list(members),
                    added=sorted(map(str, added)),
                    removed=sorted(map(str, removed)),
                    owned=len(self._state.partitions),
                )
            metrics.assigned_partitions.set(len(self._state.partitions))
            if complete:
                self.last_rebalance_error = None
            return complete

    async def _revoke(self, tps: set[TopicPartition]) -> None:
        if self._listener is not None:
            try:
                self._listener.on_partitions_revoked(set(tps))
            except Exception:
                log.exception("on_partitions_revoked failed")
        for tp in tps:
            self._state.drop(tp)
        try:
            await self._offsets.persist(tps)
        except ConsumerError as exc:
            log.warning("commit on revoke failed; retried with the next commit", error=str(exc))
        self._offsets.forget(tps)

    async def _assign(self, tps: set[TopicPartition]) -> bool:
        ordered = sorted(tps)
        try:
            positions = await self._start_positions(ordered)
        except (ConsumerError, BrokerError) as exc:
            self.last_rebalance_error = str(exc)
            log.warning(
                "start positions unknown; assignment retried", partitions=len(ordered), error=str(exc)
            )
            return False
        if self._closed:
            return False
        for tp in ordered:
            self._state.assign(tp, positions[tp], self._fetch.choose_pull_node(tp))
        if self._listener is not None:
            try:
                self._listener.on_partitions_assigned(set(ordered))
            except Exception:
                log.exception("on_partitions_assigned failed")
        return True

    async def _start_positions(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        source: dict[str, str] = {}
        if self._hook is not None:
            for tp in tps:
                pos = await self._hook(tp)
                if pos is None:
                    continue
                if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
                    raise ConsumerError(f"{tp}: start_position hook answered {pos!r}, not an offset >= 0")
                out[tp] = pos
                source[str(tp)] = "hook"
        rest = [tp for tp in tps if tp not in out]
        if rest:
            stored = await self._offsets.load(rest)
            for tp in rest:
                # a mark not persisted yet (the store was unreachable at revoke) is ours and newer
                marked = self._offsets.marked(tp)
                if marked is not None and marked > stored.get(tp, -1):
                    stored[tp] = marked
            out.update(stored)
            source.update((str(tp), "offset store") for tp in stored)
            rest = [tp for tp in rest if tp not in out]
        if rest:
            cfg = self._config
            found = await self._fetch.lookup_offsets(
                rest, _CONSUME_FROM[cfg.consume_from], cfg.consume_timestamp_ms
            )
            out.update(found)
            source.update((str(tp), f"consume_from={cfg.consume_from}") for tp in found)
        log.info("start positions", positions={str(tp): (out[tp], source[str(tp)]) for tp in tps})
        return out

    async def _commit_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._config.commit_interval)
            try:
                await self._offsets.persist()
            except ConsumerError as exc:
                log.warning("periodic offset commit failed", error=str(exc))

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        state = self._state
        assignment: dict[str, Any] = {}
        for tp, ps in sorted(state.partitions.items()):
            lag = None if ps.log_end is None else max(0, ps.log_end - ps.position)
            assignment[str(tp)] = {
                "topic": tp.topic,
                "partition": tp.partition,
                "generation": ps.generation,
                "position": ps.position,
                "committed": self._offsets.committed(tp),
                "marked": self._offsets.marked(tp),
                "log_start": ps.log_start,
                "log_end": ps.log_end,
                "lag": lag,
                "pull_node": ps.pull_node,
                "paused": ps.paused,
                "in_flight": ps.in_flight,
                "flow_control": ps.flow_reason if now < ps.flow_until else None,
                "buffered_records": ps.queue.records,
                "buffered_bytes": ps.queue.nbytes,
                "parked": ps.parked,
                "last_error": ps.last_error,
            }
        coord = self._coordinator
        nodes = self._fetch.status()
        return {
            "member_id": self.client_id,
            "group": self._config.group,
            "mode": self._config.mode,
            "generation": coord.version if coord is not None else None,
            "members": list(coord.members) if coord is not None else [self.client_id],
            "coordinator": coord.coordinator_id if coord is not None else None,
            "allocation": self._config.allocation,
            "assignment": assignment,
            "totals": {
                "owned": len(state.partitions),
                "buffered_bytes": state.buffered_bytes,
                "buffered_records": state.buffered_records,
                "budget_bytes": state.limits.max_buffered_bytes,
                "reserved_bytes": state.reserved_bytes,
                "pinned_bytes": state.pinned_bytes,
                "pinned_answers": state.pinned_bodies,
                "requests_per_node": {n: s["requests"] for n, s in nodes.items()},
                "rebalances": self.rebalances,
                "offset_resets": self._fetch.offset_resets,
                "parked": sorted(str(tp) for tp, ps in state.partitions.items() if ps.parked),
            },
            "nodes": nodes,
            "errors": {
                "metadata": self._metadata.last_error,
                "heartbeat": coord.last_error if coord is not None else None,
                "offset_store": self._offsets.last_error,
                "rebalance": self.last_rebalance_error,
            },
        }
