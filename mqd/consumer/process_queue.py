"""ProcessQueue: the buffered batches of one partition, and the flow-control hold rule.

RocketMQ's ProcessQueue with its pull thresholds (pullThresholdForQueue, ...SizeForQueue,
consumeConcurrentlyMaxSpan): a partition whose queue is over any threshold is not fetched for
``retry_s`` (50 ms by default), then looked at again. The daemon-wide byte budget is another
mechanism (mqd.consumer.budget).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa

from mqd import metrics
from mqd.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """One record batch as fetched, cut to start at the position it was requested from."""

    tp: TopicPartition
    epoch: int  # the partition's assignment epoch when it was fetched
    records: pa.RecordBatch  # columns offset, timestamp, key, value, headers (mqd.format.RECORD_SCHEMA)
    first_offset: int  # offset of records[0]
    next_offset: int  # offset after the last record
    nbytes: int  # wire bytes it held (for budgets)
    # monotonic time the answer was received: the landing sink's max_age clock starts here
    fetched_at: float = field(default_factory=time.monotonic, compare=False)
    # the log incarnation the offsets belong to (None: the source cannot tell)
    incarnation: str | None = None


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Per-partition thresholds (RocketMQ's pullThresholdForQueue & co)."""

    max_queued_records: int = 1000
    max_queued_bytes: int = 100 * 1024 * 1024
    max_offset_span: int = 2000
    retry_s: float = 0.05


class ProcessQueue:
    """Buffered batches of one partition, in offset order, with the counters flow control needs."""

    __slots__ = ("batches", "dropped", "flow_reason", "flow_until", "nbytes", "records")

    def __init__(self) -> None:
        self.batches: deque[FetchedBatch] = deque()
        self.records = 0
        self.nbytes = 0
        self.dropped = False
        self.flow_until = 0.0  # monotonic time before which flow control holds it back
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

    def hold(self, limits: FlowLimits, now: float) -> float | None:
        """When this partition must not be fetched yet: the monotonic time to look again, else None.
        Over a threshold it is held for ``retry_s`` even if drained meanwhile (RocketMQ's fixed
        retry delay), so a full queue is not polled on every wake-up."""
        if now < self.flow_until:
            return self.flow_until
        reason = None
        if self.records > limits.max_queued_records:
            reason = "records"
        elif self.nbytes > limits.max_queued_bytes:
            reason = "bytes"
        elif self.span > limits.max_offset_span:
            reason = "span"
        self.flow_reason = reason
        if reason is None:
            return None
        metrics.flow_control_events.labels(reason).inc()
        self.flow_until = now + limits.retry_s
        return self.flow_until

    def held_reason(self, now: float) -> str | None:
        """The threshold holding it back at ``now``, if any."""
        return self.flow_reason if now < self.flow_until else None
