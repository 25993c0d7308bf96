"""Node-grouped fetching: one coroutine per node, one request per round, one in flight.

Each NodeFetcher wakes when one of its partitions may have become fetchable (assignment, resume,
drain, answer handled, backoff over), collects the fetchable partitions whose pull node is its node
and sends ONE fetch for all of them through the source, its bytes shared by what exists
(mqd.consumer.fetch_shares: partitions with a backlog take what caught-up ones leave). The send
does not block the coroutine: the answer is handled by a done-callback on the loop, which
re-checks every partition (still owned, unpaused, same assignment epoch) before applying status,
position, pull-node suggestion and data; only then is the partition's data decoded.

Error handling never stops the daemon: a failing node backs off (mqd.backoff, capped exponential
with jitter) and its partitions move to a live replica; an undecodable partition is retried with
backoff and parked after repeated failures; an illegal offset follows ``on_offset_reset``
(mqd.consumer.offset_reset).

Log incarnations: every request names the incarnation its offset belongs to (once known; the first
answer's is adopted without assuming any reuse). INCARNATION_CHANGED (new incarnation J, diverged
at D, position P): with D >= P nothing fetched is affected and J is adopted at P; else offsets
D..P-1 were fetched (and maybe landed) under the old incarnation while the new log holds other
records there: an error line names the partition, both incarnations and the offsets, the metrics
count it, and fetching moves to D under J, so the new records land as new records (the landing
keys them by incarnation), and the offset store's mark moves back to D as well (``on_rewind``:
landed and committed offsets, and so lag, are the new log's; late marks of the old log's records
are ignored there). Batches keep the incarnation they were fetched under. Each request also
names the partition's earlier incarnations (mqd/consumer/incarnation_lineage.py), so a log that lost
the newest id still answers where the consumer's records diverge, not 0. DATA_LOST (a hole
the source could not repair): the lost offsets are counted, logged as an error with the range and
shown in status, and fetching continues after the hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from mqd import metrics, record_size
from mqd.backoff import backoff_delay
from mqd.config import ConsumerConfig
from mqd.consumer import incarnation_lineage
from mqd.consumer.errors import ConsumerError
from mqd.consumer.fetch_request_cache import RequestCache
from mqd.consumer.fetch_shares import share_request
from mqd.consumer.offset_reset import OffsetReset
from mqd.consumer.process_queue import FetchedBatch
from mqd.consumer.snapshot import NodeSnapshot
from mqd.consumer.source import (
    ILLEGAL_OFFSET,
    Cluster,
    FetchRequest,
    FetchResult,
    FetchStatus,
    PartitionResult,
    Source,
    SourceError,
)
from mqd.consumer.subscription_state import OwnedPartition, SubscriptionState
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer.fetcher")

# an answer that keeps failing to decode parks the partition instead of looping on it forever
MAX_CORRUPT_ANSWERS = 3
# a fetch answer's framing and head: 64 bytes, plus this per partition (ids, statuses and
# offsets; generous for topic names up to ~150 characters)
_HEAD_BYTES = 64
_ENTRY_BYTES = 320
# with nothing in flight and no timer asked for, a fetcher waits for a wake-up, but at most this long:
# a wake-up that never comes would otherwise stop its partitions for good (every wait is bounded)
IDLE_RECHECK_S = 1.0
LOST_WAKEUP_LOG_EVERY_S = 60.0


@dataclass(slots=True)
class _Sent:
    op: OwnedPartition
    epoch: int
    offset: int
    incarnation: str | None = None  # the incarnation the request named
    # fetched ahead from where the previous answer's batches end, and that answer's records did
    # not end there (clipped, corrupt, too large, an error): this partition's answer is dropped
    void: bool = False


class NodeFetcher:
    """The fetch loop of one node."""

    def __init__(self, node_id: str, manager: FetchManager) -> None:
        self.node_id = node_id
        self._m = manager
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._request: asyncio.Task[FetchResult] | None = None
        self._sent: list[_Sent] = []  # the partitions of the request in flight
        # the request in flight is a long poll over caught-up partitions: the partitions routed to
        # this node when it was sent (None: not a poll, or the source cannot cut one short)
        self._poll_routed: frozenset[TopicPartition] | None = None
        self._last: RequestCache[_Sent] = RequestCache()  # an idle round sends the same again
        self.backoff_until = 0.0
        self.failures = 0
        self.requests = 0
        self.errors = 0
        self.last_error: str | None = None
        self._turn = 0  # rotates the request order of the partitions with a backlog (fetch_shares)
        self._flowing = False  # the last answer held records: a poll at the log end waits for more
        self.wakeups_lost = 0  # fetches only the idle re-check sent (_wakeup_lost)
        self._lost_logged_at = float("-inf")

    @property
    def in_flight(self) -> bool:
        return self._request is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mqd-fetch-{self.node_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        self._leave_queue()  # its turn passes on
        request = self._request
        if request is not None:
            request.cancel()  # its done-callback releases the partitions
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if request is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await request

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        # every line logged by this task and its answer callbacks names the node
        structlog.contextvars.bind_contextvars(node=self.node_id)
        announced = True  # the last wait ended on a wake-up, or on a timer a round asked for
        while self._task is not None:  # stop() clears it before cancelling
            self._wake.clear()
            timeout: float | None = None
            if self._request is None:
                sent_before = self.requests
                try:
                    timeout = self._round()
                except Exception:  # a bug here must not kill the node's fetching for good
                    log.exception("fetch round failed", node=self.node_id)
                    timeout = 1.0
                if not announced and self.requests != sent_before:
                    self._wakeup_lost()
            elif self._poll_routed is not None:
                self._cut_poll()
            idle = self._request is None and timeout is None
            if idle:
                timeout = IDLE_RECHECK_S  # else a request's end wakes it, or the round's own timer
            woken = await wait_event(self._wake, None if timeout is None else max(timeout, 0.001))
            announced = woken or not idle

    def _wakeup_lost(self) -> None:
        """The idle re-check sent a fetch that no wake-up had announced: something made partitions
        fetchable without waking their fetcher. They lost at most IDLE_RECHECK_S; counted, and
        logged at most once a minute, since the cause is a bug to find."""
        self.wakeups_lost += 1
        metrics.fetch_wakeups_lost.labels(self.node_id).inc()
        now = time.monotonic()
        if now - self._lost_logged_at >= LOST_WAKEUP_LOG_EVERY_S:
            self._lost_logged_at = now
            log.warning(
                "fetch sent by the idle re-check: no wake-up announced its partitions",
                node=self.node_id,
                partitions=[f"{s.op.tp.topic}/{s.op.tp.partition}" for s in self._sent[:20]],
                wakeups_lost=self.wakeups_lost,
            )

    def _round(self) -> float | None:
        """Send one fetch if any partition is fetchable; returns seconds until a held-back partition
        should be looked at again (None: nothing to wait for but a wake-up)."""
        m = self._m
        now = m.clock()
        if now < self.backoff_until:
            self._leave_queue()
            return self.backoff_until - now
        cluster = m.source.cluster
        if cluster is None or self.node_id not in cluster.nodes:
            self._leave_queue()
            return None
        budget, cfg = m.state.budget, m.config
        chosen, next_at = self._fetchable(now)
        if not chosen:
            self._leave_queue()
        elif budget.exhausted() or budget.ahead(self.node_id):
            # first come, first served (budget.py "queue"); a drain, or a reservation or answer
            # body released, wakes every fetcher
            budget.wait(self.node_id)
            return None
        else:
            wait_ms = cfg.fetch_max_wait_ms
            if next_at is not None:
                # a held-back partition is due soon: do not let a long poll for the others keep
                # it waiting, since only one request may be in flight to this node
                wait_ms = min(wait_ms, max(0, int((next_at - now) * 1000)))
            # a partition whose last answer reached the log end leaves its share to those with more
            backlog = [op.log_end is None or op.position < op.log_end for op in chosen]
            # reserve what the answer can really hold: its partitions' shares, not fetch_max_bytes
            # (a long poll over caught-up partitions, one share: records that arrive meanwhile are
            # usually far fewer, and more show a backlog the next request fetches); with a held
            # budget the whole body is charged on arrival, so its head is reserved too
            head = _HEAD_BYTES + _ENTRY_BYTES * len(chosen) if budget.held else 0
            shares = len(chosen) if any(backlog) else 1
            max_bytes = min(cfg.fetch_max_bytes, budget.left() - head, shares * cfg.partition_max_bytes)
            if max_bytes <= 0:
                budget.wait(self.node_id)
                return None
            min_bytes = cfg.fetch_min_bytes
            flow = self._flowing and cfg.flow_wait_ms > 0 and not any(backlog)
            if flow:
                wait_ms = min(wait_ms, cfg.flow_wait_ms)
                min_bytes = max(min_bytes, cfg.flow_min_bytes)
            self._send(chosen, backlog, max_bytes, max_bytes + head, wait_ms, min_bytes, flow)
            self._leave_queue()
        return None if next_at is None else next_at - now

    def _fetchable(self, now: float) -> tuple[list[OwnedPartition], float | None]:
        """This node's partitions that may be fetched now, and when the first held-back one may."""
        state = self._m.state
        chosen: list[OwnedPartition] = []
        next_at: float | None = None
        for op in state.partitions.values():
            if op.pull_node != self.node_id or op.paused or op.in_flight or op.resetting:
                continue
            if op.parked and not op.probe_parked:
                continue
            hold = op.retry_at if now < op.retry_at else op.queue.hold(state.limits, now)
            if hold is not None:
                next_at = hold if next_at is None else min(next_at, hold)
                continue
            chosen.append(op)
        return chosen, next_at

    def _cut_poll(self) -> None:
        """End the long poll in flight when a partition routed here since it was sent (a pull-node
        switch, a failed node's partitions, an assignment) may be fetched and has a backlog: with
        one request in flight per node it would wait up to fetch_max_wait_ms (decision 073). The
        done-callback releases the poll's partitions and wakes this fetcher, whose next round
        fetches them all."""
        routed, request = self._poll_routed, self._request
        if routed is None or request is None:
            return
        chosen, _ = self._fetchable(self._m.clock())
        if any(op.tp not in routed and (op.log_end is None or op.position < op.log_end) for op in chosen):
            self._poll_routed = None
            metrics.fetch_polls_cut.labels(self.node_id).inc()
            request.cancel()

    def _leave_queue(self) -> None:
        """Out of the budget's line; the node first in line after it is woken for its turn."""
        first = self._m.state.budget.leave(self.node_id)
        if first is not None:
            self._m.wake(first)

    def _send(
        self,
        chosen: list[OwnedPartition],
        backlog: list[bool],
        max_bytes: int,
        reserve: int,
        wait_ms: int,
        min_bytes: int,
        flow: bool,
    ) -> None:
        """``backlog[i]``: chosen[i] may have more than its last answer reached (unknown counts).
        ``flow``: a poll that waits for records (``flow_wait_ms``): its records' age counts from now."""
        m, cfg = self._m, self._m.config
        if not any(backlog):
            # an idle round: each keeps partition_max_bytes, in the chosen order; the last request is
            # sent again while nothing in it changed (fetch_request_cache)
            part_max = min(cfg.partition_max_bytes, max_bytes)
            cached = self._last.get(chosen, part_max)
            sent, requests = cached or self._build(chosen, [part_max] * len(chosen))
            if cached is None:
                self._last.put(sent, requests, part_max)
        else:
            shares = share_request(backlog, max_bytes, cfg.partition_max_bytes, self._turn)
            self._turn += 1
            sent, requests = self._build([chosen[i] for i in shares.order], shares.max_bytes)
        request = m.source.fetch(
            self.node_id, requests, max_wait_ms=wait_ms, min_bytes=min_bytes, max_bytes=max_bytes
        )
        # records the broker held for the poll may have waited there since it was sent
        counted_from = time.monotonic() if flow else None
        if flow:
            metrics.fetch_flow_polls.labels(self.node_id).inc()
        for op in chosen:
            op.in_flight = True
        m.state.budget.reserve(reserve)
        self.requests += 1
        if not m.fetched:
            m.fetched = True  # start-up ends here: the benchmark times spawn to this line
            log.info("first fetch sent", node=self.node_id, partitions=len(sent))
        metrics.fetch_requests.labels(self.node_id).inc()
        metrics.fetch_partitions.labels(self.node_id).observe(len(sent))
        self._sent = sent
        self._poll_routed = None
        if wait_ms > 0 and not any(backlog) and m.source.cuts_long_polls:
            node = self.node_id
            self._poll_routed = frozenset(op.tp for op in m.state.partitions.values() if op.pull_node == node)
        self._request = asyncio.ensure_future(request)
        self._request.set_name(f"mqd-fetch-request-{self.node_id}")
        self._request.add_done_callback(
            functools.partial(self._on_done, sent, reserve, time.perf_counter(), wait_ms / 1000, counted_from)
        )

    @staticmethod
    def _build(ordered: list[OwnedPartition], part_max: list[int]) -> tuple[list[_Sent], list[FetchRequest]]:
        sent = [_Sent(op, op.epoch, op.position, op.incarnation) for op in ordered]
        requests = [
            FetchRequest(s.op.tp, s.offset, pm, s.incarnation, s.op.landed, s.op.lineage)
            for s, pm in zip(sent, part_max, strict=True)
        ]
        return sent, requests

    def _on_done(
        self,
        sent: list[_Sent],
        reserved: int,
        t0: float,
        max_wait: float,
        counted_from: float | None,
        task: asyncio.Task[FetchResult],
    ) -> None:
        m = self._m
        self._request = None
        self._sent = []
        self._poll_routed = None
        budget = m.state.budget
        waiting = budget.release(reserved)
        for s in sent:
            s.op.in_flight = False
        self.wake()
        if waiting:
            m.wake()
        self._flowing = False
        if task.cancelled():
            self._wake_routed_away(sent)
            return
        exc = task.exception()
        took = time.perf_counter() - t0
        metrics.fetch_duration.labels(self.node_id).observe(took)
        metrics.fetch_latency.labels(self.node_id).observe(max(0.0, took - max_wait))
        if exc is not None:
            self._on_error(exc, sent)
            self._wake_routed_away(sent)
            return
        self.failures = 0
        self.last_error = None
        result = task.result()
        budget.pin(result.body, result.nbytes)  # replaces the reservation just returned
        self._flowing = any(res.status is FetchStatus.FOUND for res in result.partitions)
        ahead = self._fetch_ahead(result, sent)
        if ahead:
            # the next request's task was scheduled first: it writes the request before this
            # answer is decoded, so the node works on it meanwhile (docs/architecture.md)
            asyncio.get_running_loop().call_soon(self._handle, result, sent, ahead, counted_from)
        else:
            self._handle(result, sent, [], counted_from)

    def _handle(
        self, result: FetchResult, sent: list[_Sent], ahead: list[_Sent], counted_from: float | None
    ) -> None:
        m = self._m
        try:
            m.handle_answer(self.node_id, result, sent, counted_from)
        except Exception:
            log.exception("fetch answer handling failed", node=self.node_id)
        self._wake_routed_away(sent)
        now = m.clock()
        for s in ahead:
            op = s.op
            # asked for at a position the handling did not leave (records that ended elsewhere, an
            # unpark, a move), or an error put the partition in backoff: never apply that answer
            if op.position != s.offset or op.parked or op.retry_at > now:
                s.void = True

    def _wake_routed_away(self, sent: list[_Sent]) -> None:
        """Partitions routed to another node while in flight here are that node's to fetch now, from
        where this answer left them (a long poll there may be cut for them: ``_cut_poll``)."""
        for s in sent:
            node = s.op.pull_node
            if node is not None and node != self.node_id:
                self._m.wake(node)

    def _fetch_ahead(self, result: FetchResult, sent: list[_Sent]) -> list[_Sent]:
        """Send the node's next request before this answer is decoded, each partition with data
        from where the answer's whole batches end (``PartitionResult.next_offset`` of FOUND), so
        the node prepares the next answer while this one is decoded. Only for a plain answer (data
        or nothing new for every partition): anything else moves positions or routes in ways only
        the full handling knows. Returns the partitions of the request sent ahead ([]: none); any
        of them whose position the handling moves elsewhere is voided after it."""
        if self._task is None:
            return []  # stopping
        by_tp = {s.op.tp: s for s in sent}
        moved: list[tuple[OwnedPartition, PartitionResult]] = []
        state = self._m.state
        for res in result.partitions:
            s = by_tp.get(res.tp)
            if s is None:
                return []
            if res.status is FetchStatus.CAUGHT_UP:
                continue
            if res.status is not FetchStatus.FOUND:
                return []
            op = s.op
            if state.is_current(op, s.epoch) and not op.paused and op.position == s.offset:
                if res.next_offset > s.offset and op.parked is None:
                    moved.append((op, res))
        if not moved:
            return []
        # the positions the answer leaves when every batch decodes, and the log ends it reports
        # (a backlog left must not be polled with a wait for bytes), for the one round that builds
        # the next request; handling the answer sets them for real (and voids what differs). A log
        # end still unknown stays so for the round, as for the request before it: the partition's
        # share of the request, and so what a Kafka fetch session lists again, does not change
        before = [(op, op.position, op.log_end) for op, _ in moved]
        for op, res in moved:
            op.position = res.next_offset
            if op.log_end is not None:
                op.log_end = res.log_end
        try:
            self._round()
        except Exception:
            log.exception("fetch round failed", node=self.node_id)
        finally:
            for op, position, log_end in before:
                op.position, op.log_end = position, log_end
        return list(self._sent)  # [] when nothing was sent

    def _on_error(self, exc: BaseException, sent: list[_Sent]) -> None:
        m = self._m
        self.failures += 1
        self.errors += 1
        self.last_error = str(exc)
        delay = m.backoff(self.failures)
        self.backoff_until = m.clock() + delay
        kind = exc.kind if isinstance(exc, SourceError) else type(exc).__name__
        metrics.fetch_errors.labels(self.node_id, kind).inc()
        for s in sent:
            if m.state.partitions.get(s.op.tp) is s.op:
                s.op.last_error = f"{self.node_id}: {exc}"
        log.warning(
            "fetch failed",
            node=self.node_id,
            kind=kind,
            error=str(exc),
            failures=self.failures,
            backoff=delay,
        )
        if isinstance(exc, SourceError) and exc.node_down:
            m.node_failed(self.node_id, delay)
        # wake up when the backoff is over (the loop also waits on it)
        asyncio.get_running_loop().call_later(delay, self.wake)

    def snapshot(self, now: float) -> NodeSnapshot:
        return NodeSnapshot(
            node_id=self.node_id,
            requests=self.requests,
            errors=self.errors,
            in_flight=self.in_flight,
            last_error=self.last_error,
            backoff_s=round(max(0.0, self.backoff_until - now), 3),
        )


class FetchManager:
    """The node fetchers, pull-node routing and the per-partition answer callback."""

    def __init__(
        self,
        *,
        config: ConsumerConfig,
        source: Source,
        state: SubscriptionState,
        clock: Callable[[], float] = time.monotonic,
        jitter: float = 0.2,
    ) -> None:
        self.config = config
        self.source = source
        self.state = state
        self.clock = clock
        self.jitter = jitter  # of every error backoff (tests pass 0 to compute delays)
        self.fetchers: dict[str, NodeFetcher] = {}
        self._down_until: dict[str, float] = {}  # nodes we failed to reach, our own view
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running = False
        self.fetched = False  # a first fetch was sent
        # since start, all partitions (status totals)
        self.incarnation_changes = 0
        self.reused_offsets = 0
        self.lost_offsets = 0
        # the offset store's OffsetStore.rewind (set by the Consumer; None: no store to move)
        self.on_rewind: Callable[[TopicPartition, int, int], None] | None = None
        self.resets = OffsetReset(
            state,
            lookup=self.lookup_offsets,
            on_error=self._partition_error,
            wake=self.wake,
            spawn=self._spawn,
            clock=clock,
        )
        state.on_fetchable = self.wake

    @property
    def offset_resets(self) -> int:
        return self.resets.resets

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` errors in a row: doubling from error_backoff_ms, capped."""
        cfg = self.config
        return backoff_delay(
            failures,
            base=cfg.error_backoff_ms / 1000,
            cap=cfg.error_backoff_max_ms / 1000,
            jitter=self.jitter,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        cluster = self.source.cluster
        if cluster is not None:
            self.on_metadata(cluster)

    async def stop(self) -> None:
        self._running = False
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        for f in fetchers:
            await f.stop()
        tasks, self._tasks = list(self._tasks), set()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def wake(self, node_id: str | None = None) -> None:
        if node_id is None:
            for f in self.fetchers.values():
                f.wake()
        elif (one := self.fetchers.get(node_id)) is not None:
            one.wake()

    # -- routing ---------------------------------------------------------------------------------

    def node_usable(self, node_id: str, cluster: Cluster | None = None) -> bool:
        cluster = cluster or self.source.cluster
        if cluster is None or not cluster.is_alive(node_id):
            return False
        return self._down_until.get(node_id, 0.0) <= self.clock()

    def choose_pull_node(self, tp: TopicPartition, exclude: str | None = None) -> str | None:
        """The partition's leader while it is usable, else its first usable replica, else the leader."""
        cluster = self.source.cluster
        if cluster is None:
            return None
        candidates = cluster.candidates(tp)
        for node_id in candidates:
            if node_id != exclude and self.node_usable(node_id, cluster):
                return node_id
        return candidates[0] if candidates else None

    def node_failed(self, node_id: str, for_s: float) -> None:
        """A node did not answer: route its partitions elsewhere and refresh metadata now."""
        self._down_until[node_id] = self.clock() + max(for_s, 1.0)
        self.source.request_refresh()
        for op in self.state.partitions.values():
            if op.pull_node == node_id:
                self._switch(op, self.choose_pull_node(op.tp, exclude=node_id), "node failed")

    def on_metadata(self, cluster: Cluster) -> None:
        if not self._running:
            return
        for node_id in cluster.nodes:
            if node_id not in self.fetchers:
                f = NodeFetcher(node_id, self)
                self.fetchers[node_id] = f
                f.start()
        for node_id in [n for n in self.fetchers if n not in cluster.nodes]:
            f = self.fetchers.pop(node_id)
            self._spawn(f.stop())
        for op in self.state.partitions.values():
            node = op.pull_node
            if node is None or node not in cluster.candidates(op.tp) or not self.node_usable(node, cluster):
                # a replica is kept while the leader is back: the replica's suggestion moves us
                self._switch(op, self.choose_pull_node(op.tp), "metadata")
        self.wake()

    def _switch(self, op: OwnedPartition, node_id: str | None, why: str) -> None:
        if node_id is None or node_id == op.pull_node:
            return
        log.info(
            "pull node switched",
            topic=op.tp.topic,
            partition=op.tp.partition,
            from_node=op.pull_node,
            to_node=node_id,
            reason=why,
        )
        op.pull_node = node_id
        self.wake(node_id)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- answers ---------------------------------------------------------------------------------

    def handle_answer(
        self, node_id: str, result: FetchResult, sent: list[_Sent], counted_from: float | None = None
    ) -> None:
        """Apply each partition's answer. ``counted_from``: the age of the records counts from then
        (a flow poll's send), not from now."""
        by_tp = {s.op.tp: s for s in sent}
        for res in result.partitions:
            tp = res.tp
            s = by_tp.pop(tp, None)
            if s is None:
                log.warning(
                    "fetch answer names a partition not asked for",
                    node=node_id,
                    topic=tp.topic,
                    partition=tp.partition,
                )
                continue
            if s.void:
                metrics.stale_responses.labels("ahead").inc()
                continue
            op = s.op
            if self.state.partitions.get(tp) is not op or op.queue.dropped:
                metrics.stale_responses.labels("revoked").inc()
                continue
            if op.epoch != s.epoch:
                metrics.stale_responses.labels("seek").inc()
                continue
            if op.paused:
                metrics.stale_responses.labels("paused").inc()
                continue
            if op.position != s.offset:
                # two requests asked for it from one offset: this answer's request was sent ahead
                # by one node while the last answer switched the partition to another, whose
                # request went out before this answer was handled; the first answer applied won
                metrics.stale_responses.labels("moved").inc()
                log.info(
                    "fetch answer dropped: the partition moved on",
                    topic=tp.topic,
                    partition=tp.partition,
                    node=node_id,
                    asked=s.offset,
                    position=op.position,
                    pull_node=op.pull_node,
                )
                continue
            self._apply(node_id, op, s.offset, res, counted_from)
        # left out of the answer: nothing new at the offset asked for, still ours (docs/protocol.md)
        for s in by_tp.values():
            if not s.void:
                self.state.no_news(s.op, s.epoch)
        metrics.fetch_partitions_unchanged.labels(node_id).inc(len(by_tp))

    def _apply(
        self, node_id: str, op: OwnedPartition, offset: int, res: PartitionResult, counted_from: float | None
    ) -> None:
        tp = op.tp
        status = res.status
        if status is FetchStatus.NOT_SERVED:
            # routing error: our metadata is stale or the node lost the partition
            self.source.request_refresh()
            self._partition_error(op, f"{node_id}: not served: {res.error or 'no reason given'}")
            self._switch(op, self.choose_pull_node(tp, exclude=node_id), "not served")
            return
        op.log_start, op.log_end = res.log_start, res.log_end
        cluster = self.source.cluster
        if op.probe_parked and status is not FetchStatus.FOUND:
            self._unpark(op, f"{node_id} answered {status}")  # what was damaged is not there any more
        if status is FetchStatus.INCARNATION_CHANGED:
            self._incarnation_changed(node_id, op, offset, res)
            return
        if res.incarnation is not None and op.incarnation is None:
            op.incarnation = res.incarnation  # the first one seen: no reuse assumed
            log.info(
                "log incarnation adopted",
                topic=tp.topic,
                partition=tp.partition,
                incarnation=res.incarnation,
                position=offset,
            )
        if status is FetchStatus.FOUND and res.incarnation not in (None, op.incarnation):
            # a source must answer INCARNATION_CHANGED instead: never tag records with the wrong log
            self._partition_error(
                op, f"{node_id}: records of incarnation {res.incarnation} for a fetch of {op.incarnation}"
            )
            return
        if status is FetchStatus.DATA_LOST:
            self._data_lost(node_id, op, offset, res)
        elif status is FetchStatus.FOUND:
            self._append_found(node_id, op, offset, res, counted_from)
        elif status is FetchStatus.CAUGHT_UP:
            op.errors = 0  # caught up: the node long-polled already
            if op.parked is None:
                op.last_error = None  # answered: an earlier fetch error is stale (as on FOUND)
        elif res.next_offset == offset:
            # a replica keeping the requested offset: its log lags, which is not a reason to move
            op.errors = 0
            if not (status is FetchStatus.NO_MESSAGE and offset == 0):
                op.retry_at = self.clock() + self.config.error_backoff_ms / 1000
                route = (
                    cluster.partitions.get(tp) if cluster is not None and node_id in cluster.nodes else None
                )
                # leadership is per partition (a Kafka broker leads some partitions, follows others)
                if route is not None and route.leader != node_id:
                    leader = self.choose_pull_node(tp)
                    if leader is not None and leader != node_id:
                        self._switch(op, leader, f"replica lags ({status})")
        elif status in ILLEGAL_OFFSET:
            self.resets.illegal_offset(op, offset, res, self.config.on_offset_reset)
        suggest = res.suggested_node
        if suggest and suggest != op.pull_node and op.parked is None:
            if cluster is None or suggest not in cluster.candidates(tp):
                self.source.request_refresh()
            elif self._down_until.get(suggest, 0.0) <= self.clock():
                self._switch(op, suggest, f"suggested by {node_id}")
            # else: we failed to reach that node moments ago; the suggesting node has not noticed
            # yet (its liveness view lags) and following it would bounce between the two
        if op.log_end is not None:
            # the fetch position's lag only: the landed lag (mqd_consumer_lag) needs the landed
            # offset, which the log-end poller owns
            metrics.consumer_fetch_lag_of.get(tp).set(max(0, op.log_end - op.position))

    def _incarnation_changed(
        self, node_id: str, op: OwnedPartition, offset: int, res: PartitionResult
    ) -> None:
        """The log our position belongs to was replaced or truncated (see the module docstring)."""
        tp, old, new = op.tp, op.incarnation, res.incarnation
        if new is None:
            self._partition_error(op, f"{node_id}: INCARNATION_CHANGED without the new incarnation")
            return
        # no divergence point given: assume the logs share nothing, the safe side (all is new)
        diverged = 0 if res.diverged_at is None else max(0, res.diverged_at)
        label = (tp.topic, str(tp.partition))
        op.incarnation_changes += 1
        self.incarnation_changes += 1
        metrics.incarnation_changes.labels(*label).inc()
        op.errors = 0
        op.lineage = incarnation_lineage.after_change(op.lineage, old, min(offset, diverged))
        op.incarnation = new
        if diverged >= offset:
            log.warning(
                "log incarnation changed; nothing fetched is affected",
                topic=tp.topic,
                partition=tp.partition,
                node=node_id,
                old_incarnation=old,
                new_incarnation=new,
                diverged_at=diverged,
                position=offset,
            )
            return
        reused = offset - diverged
        op.reused_offsets += reused
        self.reused_offsets += reused
        metrics.reused_offsets.labels(*label).inc(reused)
        op.position = diverged
        if self.on_rewind is not None:
            # what was landed and committed is the old log's: the new log's landed end is D
            self.on_rewind(tp, diverged, offset)
        op.last_error = (
            f"log incarnation changed {old} -> {new}: offsets {diverged}..{offset - 1} were fetched "
            f"under {old}; the new log's records there land as new records"
        )
        log.error(
            "log incarnation changed: offsets already fetched (and maybe landed) hold other records "
            "in the new log; fetching them again as new records",
            topic=tp.topic,
            partition=tp.partition,
            node=node_id,
            old_incarnation=old,
            new_incarnation=new,
            first_offset=diverged,
            last_offset=offset - 1,
            reused_offsets=reused,
        )

    def _data_lost(self, node_id: str, op: OwnedPartition, offset: int, res: PartitionResult) -> None:
        """The source lost a range for good (a fenced hole): count it, say so, continue after it."""
        tp = op.tp
        first = offset if res.lost_first is None else res.lost_first
        last = res.next_offset - 1 if res.lost_last is None else res.lost_last
        # what we skip is from our position to the next offset the source names
        skipped = max(0, res.next_offset - offset)
        op.lost_offsets += skipped
        self.lost_offsets += skipped
        metrics.lost_offsets.labels(tp.topic, str(tp.partition)).inc(skipped)
        op.last_error = f"{node_id}: offsets {first}..{last} lost by the source (DATA_LOST)"
        log.error(
            "records lost by the source: skipping the hole",
            topic=tp.topic,
            partition=tp.partition,
            node=node_id,
            incarnation=op.incarnation,
            lost_first=first,
            lost_last=last,
            position=offset,
            next_offset=res.next_offset,
            skipped=skipped,
        )
        op.errors = 0
        if res.next_offset > offset:
            op.position = res.next_offset
        else:  # no way forward given: do not loop on it
            self._partition_error(op, op.last_error)

    def _unpark(self, op: OwnedPartition, why: str) -> None:
        log.warning(
            "partition unparked", topic=op.tp.topic, partition=op.tp.partition, was=op.parked, why=why
        )
        op.parked = op.last_error = None
        op.probe_parked = False
        op.corrupt_answers = op.errors = 0

    def _partition_error(self, op: OwnedPartition, message: str) -> None:
        op.errors += 1
        op.last_error = message
        op.retry_at = self.clock() + self.backoff(op.errors)

    def _append_found(
        self, node_id: str, op: OwnedPartition, offset: int, res: PartitionResult, counted_from: float | None
    ) -> None:
        tp, state, budget = op.tp, self.state, self.state.budget
        fetched_at = time.monotonic() if counted_from is None else counted_from
        decoded = res.decode(offset, self.config.check_crc)
        for owner, size in decoded.held:
            budget.pin(owner, size)
        records = nbytes = 0
        clipped = too_large = False
        for d in decoded.batches:
            big = record_size.oversize(d.records, d.nbytes, self.config.max_record_bytes)
            if big is not None:  # the batch waits with it: the partition stops at its first offset
                self._park_too_large(node_id, op, *big)
                too_large = True
                break
            # hard cap on memory: stop at the budget; the rest is fetched again after a drain
            if not budget.fits(d.nbytes):
                budget.block()
                clipped = True
                break
            state.append(
                op,
                FetchedBatch(
                    tp,
                    op.epoch,
                    d.records,
                    d.first_offset,
                    d.next_offset,
                    d.nbytes,
                    fetched_at,
                    incarnation=op.incarnation,
                    leader_epoch=d.leader_epoch,
                ),
                same_answer=records > 0,
            )
            records += d.next_offset - d.first_offset
            nbytes += d.nbytes
        if records:
            label = (tp.topic, str(tp.partition))
            metrics.records_fetched.labels(*label).inc(records)
            metrics.bytes_fetched.labels(*label).inc(nbytes)
        if too_large:
            return
        if decoded.error is None or clipped:
            if op.probe_parked:
                self._unpark(op, f"{node_id} answered data that decodes")
            op.corrupt_answers = op.errors = 0
            op.last_error = None
            return
        op.corrupt_answers += 1
        metrics.fetch_errors.labels(node_id, "corrupt").inc()
        message = f"{node_id}: corrupt data at offset {op.position}: {decoded.error}"
        if op.corrupt_answers >= MAX_CORRUPT_ANSWERS:
            first = not op.parked
            op.parked = op.last_error = message
            op.probe_parked = True
            op.retry_at = self.clock() + self.config.error_backoff_max_ms / 1000
            if first:
                log.error(
                    "partition parked: data keeps failing to decode; probed again every error_backoff_max_ms",
                    topic=tp.topic,
                    partition=tp.partition,
                    error=message,
                )
        else:
            self._partition_error(op, message)
            log.warning(
                "corrupt fetch data, will retry", topic=tp.topic, partition=tp.partition, error=message
            )

    def _park_too_large(self, node_id: str, op: OwnedPartition, offset: int, size: int) -> None:
        """Park on a record the landing must not take (the Spark job could not read its file):
        not fetched again until the partition is reassigned or sought (a restart with a larger
        consumer.max_record_bytes, or a seek past it); nothing after it lands meanwhile."""
        tp, limit = op.tp, self.config.max_record_bytes
        first = op.parked is None
        what = f"{tp.topic}/{tp.partition} record at offset {offset}"
        op.parked = op.last_error = str(record_size.RecordTooLarge(what, size, limit))
        op.probe_parked = False
        metrics.fetch_errors.labels(node_id, "record_too_large").inc()
        if first:
            log.error(
                "partition parked: a record is larger than consumer.max_record_bytes",
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                size=size,
                limit=limit,
            )

    # -- offset lookups --------------------------------------------------------------------------

    async def lookup_offsets(
        self, tps: list[TopicPartition], spec: str, timestamp: int | None = None
    ) -> dict[TopicPartition, int]:
        """``earliest`` / ``latest`` / ``timestamp`` offsets, one request per serving node."""
        by_node: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            node_id = self.choose_pull_node(tp)
            if node_id is None:
                raise ConsumerError(f"{tp}: no node serves this partition (metadata)", retriable=True)
            by_node.setdefault(node_id, []).append(tp)
        out: dict[TopicPartition, int] = {}
        for node_id, group in by_node.items():
            out.update(await self.source.list_offsets(node_id, group, spec, timestamp))
        missing = [str(tp) for tp in tps if tp not in out]
        if missing:
            raise ConsumerError(f"offset lookup answered no offset for {', '.join(missing)}", retriable=True)
        return out

    def snapshot(self) -> tuple[NodeSnapshot, ...]:
        now = self.clock()
        return tuple(f.snapshot(now) for _, f in sorted(self.fetchers.items()))
