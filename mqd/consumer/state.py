"""Consumer state shared by the fetchers, the rebalancer and the drain: one object, one loop.

Modelled on aiokafka's SubscriptionState: the coordinator assigns and revokes partitions, the node
fetchers read and advance positions, the caller drains process queues. Nothing here does I/O, and
everything runs on the consumer's event loop, so no locks are needed.

Every assignment and every seek gets a fresh *generation* number (unique in the process). A
fetch records the generation it was sent with; its answer is applied only when the partition
still has that generation, so a pause, seek or revoke racing with an in-flight fetch can never
move a position or deliver data that belongs to the previous owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from mqd import metrics
from mqd.errors import MqdError
from mqd.metadata import TopicPartition


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """One record batch as fetched, cut to start at the position it was requested from."""

    tp: TopicPartition
    generation: int  # the partition's assignment generation when it was fetched
    records: pa.RecordBatch  # schema mqd.format.RECORD_SCHEMA
    first_offset: int  # offset of records[0]
    next_offset: int  # offset after the last record
    nbytes: int  # wire bytes it held (for budgets)
    # monotonic time the answer was received: the landing sink's max_age clock starts here
    fetched_at: float = field(default_factory=time.monotonic, compare=False)


class ConsumerError(MqdError):
    """A consumer-level failure. ``retriable`` says whether trying again later may succeed."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message, retriable=retriable)


class NotAssignedError(ConsumerError, KeyError):
    """An operation named a partition this consumer does not own."""

    def __init__(self, tp: TopicPartition) -> None:
        ConsumerError.__init__(self, f"partition {tp} is not assigned to this consumer", retriable=False)
        self.tp = tp

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Per-partition thresholds (RocketMQ's pullThresholdForQueue & co) and the daemon-wide budget."""

    max_queued_records: int = 1000
    max_queued_bytes: int = 100 * 1024 * 1024
    max_offset_span: int = 2000
    retry_s: float = 0.05
    max_buffered_bytes: int = 256 * 1024 * 1024


class ProcessQueue:
    """Buffered batches of one partition, in offset order, with the counters flow control needs."""

    __slots__ = ("batches", "dropped", "nbytes", "records")

    def __init__(self) -> None:
        self.batches: deque[FetchedBatch] = deque()
        self.records = 0
        self.nbytes = 0
        self.dropped = False

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def min_offset(self) -> int | None:
        return self.batches[0].first_offset if self.batches else None

    @property
    def max_offset(self) -> int | None:
        return self.batches[-1].next_offset - 1 if self.batches else None

    @property
    def span(self) -> int:
        """Last buffered offset minus first (RocketMQ's queueMaxSpan)."""
        if not self.batches:
            return 0
        return self.batches[-1].next_offset - 1 - self.batches[0].first_offset

    def append(self, batch: FetchedBatch) -> None:
        self.batches.append(batch)
        self.records += batch.next_offset - batch.first_offset
        self.nbytes += batch.nbytes

    def popleft(self) -> FetchedBatch:
        batch = self.batches.popleft()
        self.records -= batch.next_offset - batch.first_offset
        self.nbytes -= batch.nbytes
        return batch

    def clear(self) -> tuple[int, int]:
        """Discard everything; returns (records, bytes) discarded."""
        out = (self.records, self.nbytes)
        self.batches.clear()
        self.records = 0
        self.nbytes = 0
        return out


class PartitionState:
    """Everything the consumer knows about one owned partition."""

    __slots__ = (
        "corrupt_answers",
        "errors",
        "flow_reason",
        "flow_until",
        "generation",
        "in_flight",
        "last_error",
        "log_end",
        "log_start",
        "parked",
        "paused",
        "position",
        "pull_node",
        "queue",
        "resetting",
        "retry_at",
        "tp",
    )

    def __init__(self, tp: TopicPartition, generation: int, position: int, pull_node: str | None) -> None:
        self.tp = tp
        self.generation = generation
        self.position = position  # next offset to fetch
        self.pull_node = pull_node
        self.paused = False
        self.in_flight = False  # part of a fetch whose answer has not been handled yet
        self.resetting = False  # an offset lookup (on_offset_reset earliest/latest) is running
        self.queue = ProcessQueue()
        self.flow_until = 0.0  # monotonic time before which flow control holds it back
        self.flow_reason: str | None = None
        self.retry_at = 0.0  # monotonic time before which an error backs it off
        self.errors = 0  # consecutive failed fetches of this partition
        self.corrupt_answers = 0  # consecutive answers with undecodable data
        self.log_start: int | None = None  # from the last answer
        self.log_end: int | None = None
        self.last_error: str | None = None
        self.parked: str | None = None  # why it is not fetched any more (policy fail, corrupt data)


# generations are unique in the process, so a batch from one Consumer instance can never pass
# the ownership check of another
_generations = itertools.count(1)


class SubscriptionState:
    """The owned partitions and their buffered data. Positions move here (assign, seek, append) and
    in the fetch callback (offset resets)."""

    def __init__(self, limits: FlowLimits, *, budget_held: bool = False) -> None:
        self.limits = limits
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.reserved_bytes = 0  # max_bytes of fetches in flight, counted against the budget
        # Bytes of fetch answer bodies still in memory: batches are zero-copy slices, so a body
        # lives until the last slice of any of its partitions is gone, wherever it went (queue,
        # drained and held by the caller, a sink, a publication). With ``budget_held`` the budget
        # charges these instead of the buffered batch bytes: drained batches stay charged until
        # the caller drops them, so the budget bounds what the process really holds.
        self.pinned_bytes = 0
        self.pinned_bodies = 0
        self.budget_held = budget_held
        self._loop: asyncio.AbstractEventLoop | None = None
        # set when an answer did not fit the budget: no node fetches until something is drained,
        # so a nearly full budget does not turn into a loop of answers that are thrown away
        self.budget_blocked = False
        self._drain_start = 0  # rotates so one busy partition cannot starve the others
        self.data_ready = asyncio.Event()
        # called with the pull node of every partition that may have become fetchable
        self.on_fetchable: Callable[[str | None], None] = lambda node: None

    # -- assignment ------------------------------------------------------------------------------

    def _next_generation(self) -> int:
        return next(_generations)

    def assign(self, tp: TopicPartition, position: int, pull_node: str | None) -> PartitionState:
        if position < 0:
            raise ValueError(f"{tp}: start position {position} is negative")
        if tp in self.partitions:
            raise ValueError(f"{tp} is already assigned")
        ps = PartitionState(tp, self._next_generation(), position, pull_node)
        self.partitions[tp] = ps
        self.on_fetchable(pull_node)
        return ps

    def drop(self, tp: TopicPartition) -> PartitionState | None:
        """Revoke: mark dropped, discard buffered data; an in-flight answer is discarded on arrival."""
        ps = self.partitions.pop(tp, None)
        if ps is not None:
            ps.queue.dropped = True
            self._discard(ps)
        return ps

    def clear(self) -> None:
        for tp in list(self.partitions):
            self.drop(tp)

    def get(self, tp: TopicPartition) -> PartitionState:
        ps = self.partitions.get(tp)
        if ps is None:
            raise NotAssignedError(tp)
        return ps

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{tp}: cannot seek to {offset!r}: offsets are integers >= 0")
        ps = self.get(tp)
        ps.generation = self._next_generation()
        self._discard(ps)
        ps.position = offset
        ps.parked = None
        ps.last_error = None
        ps.errors = ps.corrupt_answers = 0
        ps.retry_at = ps.flow_until = 0.0
        ps.resetting = False
        self.on_fetchable(ps.pull_node)

    def set_paused(self, tps: Iterable[TopicPartition], paused: bool) -> None:
        for tp in tps:
            ps = self.get(tp)
            if ps.paused != paused:
                ps.paused = paused
                if not paused:
                    self.on_fetchable(ps.pull_node)

    # -- buffering -------------------------------------------------------------------------------

    def _discard(self, ps: PartitionState) -> None:
        records, nbytes = ps.queue.clear()
        if records or nbytes:
            self.buffered_records -= records
            self.buffered_bytes -= nbytes
            metrics.buffered_bytes.set(self.buffered_bytes)
            if not self.buffered_records:
                self.data_ready.clear()
            self.budget_blocked = False
            self.on_fetchable(None)  # budget freed: any node may fetch again

    def budget_left(self) -> int:
        # pinned covers every buffered batch once answers are tracked; max() keeps untracked
        # batches (an answer that could not be tracked, hand-made ones) counted
        held = max(self.pinned_bytes, self.buffered_bytes) if self.budget_held else self.buffered_bytes
        return self.limits.max_buffered_bytes - held - self.reserved_bytes

    def pin(self, body: object, nbytes: int) -> bool:
        """Charge an answer body of ``nbytes`` until it is freed; False when it cannot be tracked
        (it does not take weak references, e.g. plain bytes)."""
        try:
            fin = weakref.finalize(body, self._freed_from_any_thread, nbytes)
        except TypeError:
            return False
        fin.atexit = False
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self.pinned_bytes += nbytes
        self.pinned_bodies += 1
        return True

    def _freed_from_any_thread(self, nbytes: int) -> None:
        # runs wherever the last slice died: a landing worker thread, or the loop in the middle
        # of any statement; counters are only touched on the loop, between callbacks
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: nothing left to account
                loop.call_soon_threadsafe(self._unpin, nbytes)

    def _unpin(self, nbytes: int) -> None:
        self.pinned_bytes -= nbytes
        self.pinned_bodies -= 1
        if self.budget_held:
            self.budget_blocked = False
            self.on_fetchable(None)  # budget freed: any node may fetch again

    def append(self, ps: PartitionState, batch: FetchedBatch) -> None:
        ps.queue.append(batch)
        ps.position = batch.next_offset
        self.buffered_records += batch.next_offset - batch.first_offset
        self.buffered_bytes += batch.nbytes
        metrics.buffered_bytes.set(self.buffered_bytes)
        self.data_ready.set()

    def flow_hold(self, ps: PartitionState, now: float) -> float | None:
        """When ``ps`` must not be fetched yet: the monotonic time to look again, else None."""
        if now < ps.flow_until:
            return ps.flow_until
        q, lim = ps.queue, self.limits
        reason = None
        if q.records > lim.max_queued_records:
            reason = "records"
        elif q.nbytes > lim.max_queued_bytes:
            reason = "bytes"
        elif q.span > lim.max_offset_span:
            reason = "span"
        ps.flow_reason = reason
        if reason is None:
            return None
        metrics.flow_control_events.labels(reason).inc()
        ps.flow_until = now + lim.retry_s
        return ps.flow_until

    def drain(self, max_bytes: int | None = None) -> list[FetchedBatch]:
        """Take buffered batches (at least one when any is there), oldest first per partition."""
        if not self.buffered_bytes and not self.buffered_records:
            self.data_ready.clear()
            return []
        out: list[FetchedBatch] = []
        taken = 0
        pss = [ps for ps in self.partitions.values() if ps.queue.batches]
        if pss:
            start = self._drain_start % len(pss)
            self._drain_start += 1
            for ps in pss[start:] + pss[:start]:
                q = ps.queue
                while q.batches:
                    if max_bytes is not None and out and taken + q.batches[0].nbytes > max_bytes:
                        break
                    batch = q.popleft()
                    taken += batch.nbytes
                    self.buffered_bytes -= batch.nbytes
                    self.buffered_records -= batch.next_offset - batch.first_offset
                    out.append(batch)
                self.on_fetchable(ps.pull_node)
                if max_bytes is not None and taken >= max_bytes:
                    break
        metrics.buffered_bytes.set(self.buffered_bytes)
        if not self.buffered_records:
            self.data_ready.clear()
        if out:
            self.budget_blocked = False
            self.on_fetchable(None)
        return out
