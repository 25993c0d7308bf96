"""The flow-control hold rule of a ProcessQueue, table-driven: which threshold holds a partition
back, for how long (retry_s, 50 ms by default), and that exactly at a threshold is not over it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mqd.consumer.process_queue import FetchedBatch, FlowLimits, ProcessQueue
from mqd.topic_partition import TopicPartition

TP = TopicPartition("t", 0)
EMPTY = pa.RecordBatch.from_pydict({"offset": pa.array([], pa.int64())})


def queue(*batches: tuple[int, int, int]) -> ProcessQueue:
    """A queue of (first_offset, records, bytes) batches."""
    q = ProcessQueue()
    for first, count, nbytes in batches:
        q.append(FetchedBatch(TP, 1, EMPTY, first, first + count, nbytes))
    return q


LIMITS = FlowLimits(max_queued_records=10, max_queued_bytes=100, max_offset_span=20, retry_s=0.05)


@pytest.mark.parametrize(
    ("batches", "reason"),
    [
        ([], None),
        ([(0, 10, 100)], None),  # exactly at the record and byte thresholds
        ([(0, 11, 1)], "records"),
        ([(0, 1, 101)], "bytes"),
        ([(0, 5, 1), (16, 5, 1)], None),  # span 20: at the threshold
        ([(0, 5, 1), (17, 5, 1)], "span"),
        ([(0, 11, 101)], "records"),  # records is looked at first
        ([(0, 1, 101), (30, 1, 1)], "bytes"),  # then bytes, then span
    ],
)
def test_hold_reason(batches: list[tuple[int, int, int]], reason: str | None) -> None:
    """Each threshold holds the partition for retry_s; under or at every threshold it is fetchable."""
    q = queue(*batches)
    now = 10.0
    until = q.hold(LIMITS, now)
    assert q.flow_reason == reason
    assert until == (None if reason is None else pytest.approx(now + 0.05))
    assert q.held_reason(now) == reason


def test_hold_lasts_retry_s_even_when_drained() -> None:
    """Once held, the partition stays held until retry_s has passed, even if drained meanwhile."""
    q = queue((0, 11, 1))
    assert q.hold(LIMITS, 10.0) == pytest.approx(10.05)
    q.clear()
    assert q.hold(LIMITS, 10.04) == pytest.approx(10.05)
    assert q.hold(LIMITS, 10.06) is None
    assert q.held_reason(10.06) is None


def test_seed_defaults() -> None:
    """The seed thresholds (RocketMQ's) and the 50 ms retry are unchanged."""
    assert FlowLimits() == FlowLimits(
        max_queued_records=1000, max_queued_bytes=100 * 1024 * 1024, max_offset_span=2000, retry_s=0.05
    )
