"""ProcessQueue: the buffered batches of one partition, and the flow-control hold rule.

RocketMQ's ProcessQueue with its pull thresholds (pullThresholdForQueue, ...SizeForQueue,
consumeConcurrentlyMaxSpan): a partition whose queue, not counting its newest fetch answer, is over
any threshold is not fetched; a drain lifts the hold at once (it wakes the fetcher), else it is looked
at again after ``retry_s`` (50 ms by default). The daemon-wide byte budget is another mechanism
(mqd.consumer.budget).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqd import metrics
from mqd.lazy_import import lazy_import
from mqd.topic_partition import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_import("pyarrow")


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """One record batch as fetched, cut to start at the position it was requested from."""

    tp: TopicPartition
    epoch: int  # the partition's assignment epoch when it was fetched
    records: pa.RecordBatch  # columns offset, timestamp, key, value, headers (mqd.records.RECORD_SCHEMA)
    first_offset: int  # offset of records[0]
    next_offset: int  # offset after the last record
    nbytes: int  # wire bytes it held (for budgets)
    # monotonic time the answer was received: the landing sink's max_age clock starts here
    fetched_at: float = field(default_factory=time.monotonic, compare=False)
    # the log incarnation the offsets belong to (None: the source cannot tell)
    incarnation: str | None = None
    # the source's leader epoch of the last record (Kafka; None: none): the landing keeps it
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Per-partition thresholds (RocketMQ's pullThresholdForQueue & co)."""

    max_queued_records: int = 1000
    max_queued_bytes: int = 100 * 1024 * 1024
    max_offset_span: int = 2000
    retry_s: float = 0.05


class ProcessQueue:
    """Buffered batches of one partition, in offset order, with the counters flow control needs."""

    __slots__ = (
        "batches",
        "dropped",
        "flow_reason",
        "flow_until",
        "nbytes",
        "newest_bytes",
        "newest_first",
        "newest_records",
        "older_next",
        "records",
    )

    def __init__(self) -> None:
        self.batches: deque[FetchedBatch] = deque()
        self.records = 0
        self.nbytes = 0
        self.dropped = False
        # the newest fetch answer's share of the queue: the thresholds look at what is older
        self.newest_records = 0
        self.newest_bytes = 0
        self.newest_first = 0
        self.older_next = 0  # offset after the last batch older than the newest answer
        self.flow_until = 0.0  # while held: when the fetcher looks again at the latest
        self.flow_reason: str | None = None

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

    def append(self, batch: FetchedBatch, same_answer: bool = False) -> None:
        """Buffer ``batch``; ``same_answer``: it came in the same fetch answer as the previous one."""
        count = batch.next_offset - batch.first_offset
        if not same_answer or not self.batches:
            self.newest_records = self.newest_bytes = 0
            self.newest_first = batch.first_offset
            self.older_next = self.batches[-1].next_offset if self.batches else 0
        self.batches.append(batch)
        self.records += count
        self.nbytes += batch.nbytes
        self.newest_records += count
        self.newest_bytes += batch.nbytes

    def popleft(self) -> FetchedBatch:
        batch = self.batches.popleft()
        count = batch.next_offset - batch.first_offset
        self.records -= count
        self.nbytes -= batch.nbytes
        if batch.first_offset >= self.newest_first:  # the drain reached the newest answer
            self.newest_records -= count
            self.newest_bytes -= batch.nbytes
        return batch

    def clear(self) -> tuple[int, int]:
        """Discard everything; returns (records, bytes) discarded."""
        out = (self.records, self.nbytes)
        self.batches.clear()
        self.records = self.nbytes = 0
        self.newest_records = self.newest_bytes = 0
        return out

    def over(self, limits: FlowLimits) -> str | None:
        """The threshold the queue is over, not counting its newest answer: one answer may hold
        more than ``max_queued_records`` (it is sized in bytes), and it may wait to be drained while
        the next fetch is in flight. Pure."""
        if not self.batches:
            return None  # no drain could ever lift a hold on an empty queue: never hold one
        older = self.records - self.newest_records
        if older <= 0:
            return None
        if older > limits.max_queued_records:
            return "records"
        if self.nbytes - self.newest_bytes > limits.max_queued_bytes:
            return "bytes"
        if self.older_next - 1 - self.batches[0].first_offset > limits.max_offset_span:
            return "span"
        return None

    def hold(self, limits: FlowLimits, now: float) -> float | None:
        """When this partition must not be fetched yet: the monotonic time to look again, else None.
        Held, it is looked at again after ``retry_s`` or at once when a drain wakes its fetcher
        (a drain lifts the hold; the timer is for what no drain announces, e.g. a config change)."""
        reason = self.over(limits)
        if reason is not None and self.flow_reason != reason:
            metrics.flow_control_events.labels(reason).inc()  # once per hold, not per look
        self.flow_reason = reason
        if reason is None:
            self.flow_until = 0.0
            return None
        self.flow_until = now + limits.retry_s
        return self.flow_until

    def held_reason(self, limits: FlowLimits) -> str | None:
        """The threshold holding it back now, if any."""
        return self.over(limits)
