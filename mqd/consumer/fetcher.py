"""Node-grouped fetching: one coroutine per broker node, one request per round, one in flight.

Each NodeFetcher wakes when one of its partitions may have become fetchable (assignment, resume,
drain, answer handled, backoff over), collects the fetchable partitions whose pull node is its node
and sends ONE fetch for all of them. The send does not block the coroutine: the answer is handled by
a done-callback on the loop, which re-checks every partition (still owned, unpaused, same
generation) before applying status, position, pull-node suggestion and data.

Error handling never stops the daemon: a failing node backs off (capped exponential) and its
partitions move to a live replica; an undecodable partition is retried with backoff and parked after
repeated failures; an illegal offset follows ``on_offset_reset``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog

from mqd import format, metrics
from mqd.client import BrokerClient, BrokerError
from mqd.config import ConsumerConfig
from mqd.consumer.metadata import ClusterMetadata, MetadataCache
from mqd.consumer.state import (
    ConsumerError,
    FetchedBatch,
    PartitionState,
    SubscriptionState,
    TopicPartition,
)
from mqd.protocol import FetchAnswer, PartitionFetch, ProtocolError, Status
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.consumer.fetcher")

# an answer that keeps failing to decode parks the partition instead of looping on it forever
MAX_CORRUPT_ANSWERS = 3
_ILLEGAL = (Status.OFFSET_TOO_SMALL, Status.OFFSET_OVERFLOW_BADLY, Status.NO_MESSAGE_IN_QUEUE)
# a fetch answer's framing and JSON head: 64 bytes, plus this per partition (ids, statuses and
# offsets; generous for topic names up to ~150 characters)
_HEAD_BYTES = 64
_ENTRY_BYTES = 320


@dataclass(slots=True)
class _Sent:
    ps: PartitionState
    generation: int
    offset: int


def backoff_delay(cfg: ConsumerConfig, failures: int) -> float:
    """Seconds to wait after ``failures`` errors in a row: doubling from error_backoff_ms, capped."""
    return min(cfg.error_backoff_max_ms, cfg.error_backoff_ms * 2 ** min(failures - 1, 20)) / 1000


class NodeFetcher:
    """The fetch loop of one broker node."""

    def __init__(self, node_id: str, manager: FetchManager) -> None:
        self.node_id = node_id
        self._m = manager
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._request: asyncio.Task[FetchAnswer] | None = None
        self.backoff_until = 0.0
        self.failures = 0
        self.requests = 0
        self.errors = 0
        self.last_error: str | None = None

    @property
    def in_flight(self) -> bool:
        return self._request is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"mqd-fetch-{self.node_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
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
        while self._task is not None:  # stop() clears it before cancelling
            self._wake.clear()
            timeout: float | None = None
            if self._request is None:
                try:
                    timeout = self._round()
                except Exception:  # a bug here must not kill the node's fetching for good
                    log.exception("fetch round failed", node=self.node_id)
                    timeout = 1.0
            await wait_event(self._wake, None if timeout is None else max(timeout, 0.001))

    def _round(self) -> float | None:
        """Send one fetch if any partition is fetchable; returns seconds until a held-back partition
        should be looked at again (None: nothing to wait for but a wake-up)."""
        m = self._m
        now = m.clock()
        if now < self.backoff_until:
            return self.backoff_until - now
        md = m.metadata.current
        node = md.nodes.get(self.node_id) if md is not None else None
        if node is None:
            return None
        state, cfg = m.state, m.config
        budget = state.budget_left()
        if budget <= 0 or state.budget_blocked:
            self._wait_for_budget()
            return None  # a drain, or a reservation or answer body released, wakes every fetcher
        chosen: list[PartitionState] = []
        next_at: float | None = None
        for ps in state.partitions.values():
            if ps.pull_node != self.node_id or ps.paused or ps.in_flight or ps.resetting or ps.parked:
                continue
            hold = ps.retry_at if now < ps.retry_at else state.flow_hold(ps, now)
            if hold is not None:
                next_at = hold if next_at is None else min(next_at, hold)
                continue
            chosen.append(ps)
        if chosen:
            wait_ms = cfg.fetch_max_wait_ms
            if next_at is not None:
                # a held-back partition is due soon: do not let a long poll for the others keep
                # it waiting, since only one request may be in flight to this node
                wait_ms = min(wait_ms, max(0, int((next_at - now) * 1000)))
            # reserve what the answer can really hold: its partitions' shares, not fetch_max_bytes;
            # with budget_held the whole body is charged on arrival, so its head is reserved too
            head = _HEAD_BYTES + _ENTRY_BYTES * len(chosen) if state.budget_held else 0
            max_bytes = min(cfg.fetch_max_bytes, budget - head, len(chosen) * cfg.partition_max_bytes)
            if max_bytes <= 0:
                self._wait_for_budget()
                return None
            self._send(node.url, chosen, max_bytes, max_bytes + head, wait_ms)
        return None if next_at is None else next_at - now

    def _wait_for_budget(self) -> None:
        metrics.flow_control_events.labels("budget").inc()
        self._m.budget_waiting = True

    def _send(
        self, url: str, chosen: list[PartitionState], max_bytes: int, reserve: int, wait_ms: int
    ) -> None:
        m, cfg = self._m, self._m.config
        part_max = min(cfg.partition_max_bytes, max_bytes)
        sent = [_Sent(ps, ps.generation, ps.position) for ps in chosen]
        body = [
            {
                "topic": s.ps.tp.topic,
                "partition": s.ps.tp.partition,
                "offset": s.offset,
                "max_bytes": part_max,
            }
            for s in sent
        ]
        for ps in chosen:
            ps.in_flight = True
        m.state.reserved_bytes += reserve
        self.requests += 1
        metrics.fetch_requests.labels(self.node_id).inc()
        metrics.fetch_partitions.labels(self.node_id).observe(len(sent))
        self._request = asyncio.create_task(
            m.client.fetch(
                url,
                body,
                client_id=m.client_id,
                max_wait_ms=wait_ms,
                min_bytes=cfg.fetch_min_bytes,
                max_bytes=max_bytes,
            ),
            name=f"mqd-fetch-request-{self.node_id}",
        )
        self._request.add_done_callback(functools.partial(self._on_done, sent, reserve, time.perf_counter()))

    def _on_done(self, sent: list[_Sent], reserved: int, t0: float, task: asyncio.Task[FetchAnswer]) -> None:
        m = self._m
        self._request = None
        m.state.reserved_bytes -= reserved
        for s in sent:
            s.ps.in_flight = False
        self.wake()
        if m.budget_waiting:
            m.budget_waiting = False
            m.wake()
        if task.cancelled():
            return
        exc = task.exception()
        metrics.fetch_latency.labels(self.node_id).observe(time.perf_counter() - t0)
        if exc is not None:
            self._on_error(exc, sent)
            return
        self.failures = 0
        self.last_error = None
        answer = task.result()
        m.state.pin(answer.buffer, len(answer.buffer))  # replaces the reservation just returned
        try:
            m.handle_answer(self.node_id, answer, sent)
        except Exception:
            log.exception("fetch answer handling failed", node=self.node_id)

    def _on_error(self, exc: BaseException, sent: list[_Sent]) -> None:
        m = self._m
        self.failures += 1
        self.errors += 1
        self.last_error = str(exc)
        delay = backoff_delay(m.config, self.failures)
        self.backoff_until = m.clock() + delay
        if isinstance(exc, BrokerError):
            kind = "transport" if exc.status is None else f"http_{exc.status}"
        elif isinstance(exc, ProtocolError):
            kind = "protocol"
        else:
            kind = type(exc).__name__
        metrics.fetch_errors.labels(self.node_id, kind).inc()
        for s in sent:
            if m.state.partitions.get(s.ps.tp) is s.ps:
                s.ps.last_error = f"{self.node_id}: {exc}"
        log.warning(
            "fetch failed",
            node=self.node_id,
            kind=kind,
            error=str(exc),
            failures=self.failures,
            backoff=delay,
        )
        if isinstance(exc, BrokerError) and (exc.status is None or exc.status >= 500):
            m.node_failed(self.node_id, delay)
        # wake up when the backoff is over (the loop also waits on it)
        asyncio.get_running_loop().call_later(delay, self.wake)


class FetchManager:
    """The node fetchers, pull-node routing and the per-partition answer callback."""

    def __init__(
        self,
        *,
        config: ConsumerConfig,
        client: BrokerClient,
        state: SubscriptionState,
        metadata: MetadataCache,
        client_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.client = client
        self.state = state
        self.metadata = metadata
        self.client_id = client_id
        self.clock = clock
        self.fetchers: dict[str, NodeFetcher] = {}
        self._down_until: dict[str, float] = {}  # nodes we failed to reach, our own view
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running = False
        self.offset_resets = 0
        self.budget_waiting = False  # some fetcher is idle because the budget was used up
        state.on_fetchable = self.wake

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        md = self.metadata.current
        if md is not None:
            self.on_metadata(md)

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

    def node_usable(self, node_id: str, md: ClusterMetadata | None = None) -> bool:
        md = md or self.metadata.current
        if md is None or not md.is_alive(node_id):
            return False
        return self._down_until.get(node_id, 0.0) <= self.clock()

    def choose_pull_node(self, tp: TopicPartition, exclude: str | None = None) -> str | None:
        """The partition's master while it is usable, else its first usable replica, else the master."""
        md = self.metadata.current
        if md is None:
            return None
        candidates = md.candidates(tp)
        for node_id in candidates:
            if node_id != exclude and self.node_usable(node_id, md):
                return node_id
        return candidates[0] if candidates else None

    def node_failed(self, node_id: str, for_s: float) -> None:
        """A node did not answer: route its partitions elsewhere and refresh metadata now."""
        self._down_until[node_id] = self.clock() + max(for_s, 1.0)
        self.metadata.request_refresh()
        for ps in self.state.partitions.values():
            if ps.pull_node == node_id:
                self._switch(ps, self.choose_pull_node(ps.tp, exclude=node_id), "node failed")

    def on_metadata(self, md: ClusterMetadata) -> None:
        if not self._running:
            return
        for node_id in md.nodes:
            if node_id not in self.fetchers:
                f = NodeFetcher(node_id, self)
                self.fetchers[node_id] = f
                f.start()
        for node_id in [n for n in self.fetchers if n not in md.nodes]:
            f = self.fetchers.pop(node_id)
            self._spawn(f.stop())
        for ps in self.state.partitions.values():
            node = ps.pull_node
            if node is None or node not in md.candidates(ps.tp) or not self.node_usable(node, md):
                # a replica is kept while the master is back: the replica's suggestion moves us
                self._switch(ps, self.choose_pull_node(ps.tp), "metadata")
        self.wake()

    def _switch(self, ps: PartitionState, node_id: str | None, why: str) -> None:
        if node_id is None or node_id == ps.pull_node:
            return
        log.info(
            "pull node switched",
            topic=ps.tp.topic,
            partition=ps.tp.partition,
            from_node=ps.pull_node,
            to_node=node_id,
            reason=why,
        )
        ps.pull_node = node_id
        self.wake(node_id)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- answers ---------------------------------------------------------------------------------

    def handle_answer(self, node_id: str, answer: FetchAnswer, sent: list[_Sent]) -> None:
        by_tp = {s.ps.tp: s for s in sent}
        for pf in answer.partitions:
            tp = TopicPartition(pf.topic, pf.partition)
            s = by_tp.pop(tp, None)
            if s is None:
                log.warning(
                    "fetch answer names a partition not asked for",
                    node=node_id,
                    topic=tp.topic,
                    partition=tp.partition,
                )
                continue
            ps = s.ps
            if self.state.partitions.get(tp) is not ps or ps.queue.dropped:
                metrics.stale_responses.labels("revoked").inc()
                continue
            if ps.generation != s.generation:
                metrics.stale_responses.labels("seek").inc()
                continue
            if ps.paused:
                metrics.stale_responses.labels("paused").inc()
                continue
            self._apply(node_id, ps, s.offset, pf)
        for s in by_tp.values():
            if self.state.partitions.get(s.ps.tp) is s.ps and s.ps.generation == s.generation:
                self._partition_error(s.ps, f"{node_id}: answer left the partition out")

    def _apply(self, node_id: str, ps: PartitionState, offset: int, pf: PartitionFetch) -> None:
        tp = ps.tp
        status = pf.status
        if status is Status.NOT_SERVED:
            # routing error: our metadata is stale or the node lost the partition
            self.metadata.request_refresh()
            self._partition_error(ps, f"{node_id}: not served: {pf.error or 'no reason given'}")
            self._switch(ps, self.choose_pull_node(tp, exclude=node_id), "not served")
            return
        ps.log_start, ps.log_end = pf.min_offset, pf.max_offset
        if status is Status.FOUND:
            self._append_found(node_id, ps, offset, pf)
        elif status is Status.OFFSET_OVERFLOW_ONE:
            ps.errors = 0  # caught up: the broker long-polled already
        elif pf.next_offset == offset:
            # a slave keeping the requested offset: its log lags, which is not a reason to move
            ps.errors = 0
            if not (status is Status.NO_MESSAGE_IN_QUEUE and offset == 0):
                ps.retry_at = self.clock() + self.config.error_backoff_ms / 1000
                node = self.metadata.current.nodes.get(node_id) if self.metadata.current else None
                if node is not None and node.role != "master":
                    master = self.choose_pull_node(tp)
                    if master is not None and master != node_id:
                        self._switch(ps, master, f"replica lags ({status})")
        elif status in _ILLEGAL:
            self._illegal_offset(ps, offset, pf)
        if pf.suggest and pf.suggest != ps.pull_node and ps.parked is None:
            md = self.metadata.current
            if md is None or pf.suggest not in md.candidates(tp):
                self.metadata.request_refresh()
            elif self._down_until.get(pf.suggest, 0.0) <= self.clock():
                self._switch(ps, pf.suggest, f"suggested by {node_id}")
            # else: we failed to reach that node moments ago; the suggesting node has not noticed
            # yet (its liveness view lags) and following it would bounce between the two
        if ps.log_end is not None:
            metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(max(0, ps.log_end - ps.position))

    def _partition_error(self, ps: PartitionState, message: str) -> None:
        ps.errors += 1
        ps.last_error = message
        ps.retry_at = self.clock() + backoff_delay(self.config, ps.errors)

    def _decode(
        self, ps: PartitionState, offset: int, data: memoryview
    ) -> tuple[list[FetchedBatch], format.BatchError | None]:
        """Batches from ``offset`` on, cut to start there; stops at the first bad batch and returns
        the good ones before it with the error, so one damaged batch does not hold back the rest."""
        batches: list[FetchedBatch] = []
        expected, pos, check = offset, 0, self.config.check_crc
        pbuf: pa.Buffer | None = None
        try:
            while pos < len(data):
                info = format.read_header(data, pos)
                if check:
                    format.check_crc(data, info)
                pos += info.length
                if info.next_offset <= expected:
                    continue  # wholly below the requested offset
                if info.base_offset > expected:
                    raise format.BatchError(
                        f"offset gap: expected {expected}, batch starts at {info.base_offset}"
                    )
                if pbuf is None:
                    pbuf = pa.py_buffer(data)  # zero-copy view of the answer
                cut = expected if info.base_offset < expected else None
                # a CRC match means these are the bytes the broker validated deeply on produce
                records = format.to_arrow(pbuf, info, start_offset=cut, deep_check=not check)
                batches.append(
                    FetchedBatch(ps.tp, ps.generation, records, expected, info.next_offset, info.length)
                )
                expected = info.next_offset
        except format.BatchError as exc:
            return batches, exc
        return batches, None

    def _append_found(self, node_id: str, ps: PartitionState, offset: int, pf: PartitionFetch) -> None:
        tp, state = ps.tp, self.state
        batches, error = self._decode(ps, offset, pf.data)
        records = nbytes = 0
        budget = state.limits.max_buffered_bytes
        clipped = False
        for b in batches:
            # hard cap on memory: stop at the budget; the rest is fetched again after a drain
            if state.buffered_bytes and state.buffered_bytes + b.nbytes > budget:
                metrics.flow_control_events.labels("budget").inc()
                state.budget_blocked = clipped = True
                break
            state.append(ps, b)
            records += b.next_offset - b.first_offset
            nbytes += b.nbytes
        if records:
            label = (tp.topic, str(tp.partition))
            metrics.records_fetched.labels(*label).inc(records)
            metrics.bytes_fetched.labels(*label).inc(nbytes)
        if error is None or clipped:
            ps.corrupt_answers = ps.errors = 0
            ps.last_error = None
            return
        ps.corrupt_answers += 1
        metrics.fetch_errors.labels(node_id, "corrupt").inc()
        message = f"{node_id}: corrupt data at offset {ps.position}: {error}"
        if ps.corrupt_answers >= MAX_CORRUPT_ANSWERS:
            ps.parked = ps.last_error = message
            log.error(
                "partition parked: data keeps failing to decode",
                topic=tp.topic,
                partition=tp.partition,
                error=message,
            )
        else:
            self._partition_error(ps, message)
            log.warning(
                "corrupt fetch data, will retry", topic=tp.topic, partition=tp.partition, error=message
            )

    def _illegal_offset(self, ps: PartitionState, offset: int, pf: PartitionFetch) -> None:
        tp, policy = ps.tp, self.config.on_offset_reset
        metrics.offset_resets.labels(tp.topic, str(tp.partition), pf.status.value).inc()
        self.offset_resets += 1
        where = f"log {pf.min_offset}..{pf.max_offset}"
        if policy == "broker":
            log.warning(
                "offset moved by broker",
                topic=tp.topic,
                partition=tp.partition,
                status=pf.status.value,
                from_offset=offset,
                to_offset=pf.next_offset,
                policy=policy,
                log_start=pf.min_offset,
                log_end=pf.max_offset,
            )
            ps.position = pf.next_offset
        elif policy == "fail":
            ps.parked = f"{pf.status.value} at offset {offset} ({where}); on_offset_reset = fail"
            ps.last_error = ps.parked
            log.error(
                "illegal offset, partition parked",
                topic=tp.topic,
                partition=tp.partition,
                status=pf.status.value,
                from_offset=offset,
                to_offset=None,
                policy=policy,
                log_start=pf.min_offset,
                log_end=pf.max_offset,
            )
        else:
            ps.resetting = True
            self._spawn(self._reset(ps, ps.generation, offset, policy, pf.status))

    async def _reset(
        self, ps: PartitionState, generation: int, offset: int, policy: str, status: Status
    ) -> None:
        tp = ps.tp
        try:
            found = await self.lookup_offsets([tp], policy)
            target = found[tp]
        except (BrokerError, ConsumerError, KeyError) as exc:
            ps.resetting = False
            self._partition_error(ps, f"offset reset ({policy}) failed: {exc}")
            log.warning(
                "offset reset lookup failed",
                topic=tp.topic,
                partition=tp.partition,
                policy=policy,
                error=str(exc),
            )
            asyncio.get_running_loop().call_later(ps.retry_at - self.clock(), self.wake, ps.pull_node)
            return
        ps.resetting = False
        if self.state.partitions.get(tp) is not ps or ps.generation != generation:
            return  # revoked or sought meanwhile: the newer decision stands
        log.warning(
            "offset reset",
            topic=tp.topic,
            partition=tp.partition,
            status=status.value,
            from_offset=offset,
            to_offset=target,
            policy=policy,
        )
        ps.position = target
        self.wake(ps.pull_node)

    async def lookup_offsets(
        self, tps: list[TopicPartition], spec: str, timestamp: int | None = None
    ) -> dict[TopicPartition, int]:
        """``earliest`` / ``latest`` / ``timestamp`` offsets, one request per serving node."""
        by_node: dict[str, list[TopicPartition]] = {}
        md = self.metadata.current
        for tp in tps:
            node_id = self.choose_pull_node(tp)
            if md is None or node_id is None:
                raise ConsumerError(f"{tp}: no node serves this partition (metadata)", retriable=True)
            by_node.setdefault(node_id, []).append(tp)
        out: dict[TopicPartition, int] = {}
        assert md is not None
        for node_id, group in by_node.items():
            body: list[dict[str, Any]] = []
            for tp in group:
                entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "spec": spec}
                if spec == "timestamp":
                    entry["timestamp"] = timestamp
                body.append(entry)
            rows = await self.client.list_offsets(md.nodes[node_id].url, body)
            for row in rows:
                try:
                    tp = TopicPartition(str(row["topic"]), int(row["partition"]))
                    if row.get("error"):
                        raise ConsumerError(f"{tp}: offset lookup: {row['error']}", retriable=True)
                    out[tp] = int(row["offset"])
                except (KeyError, TypeError, ValueError) as exc:
                    raise ConsumerError(f"malformed offsets answer {row!r}", retriable=True) from exc
        missing = [str(tp) for tp in tps if tp not in out]
        if missing:
            raise ConsumerError(f"offset lookup answered no offset for {', '.join(missing)}", retriable=True)
        return out

    def status(self) -> dict[str, Any]:
        return {
            node_id: {
                "requests": f.requests,
                "errors": f.errors,
                "in_flight": f.in_flight,
                "last_error": f.last_error,
                "backoff_s": round(max(0.0, f.backoff_until - self.clock()), 3),
            }
            for node_id, f in sorted(self.fetchers.items())
        }
