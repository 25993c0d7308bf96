"""The flow-control hold rule of a ProcessQueue, table-driven and as a property: which threshold
holds a partition back, that the newest fetch answer does not count towards them, that exactly at a
threshold is not over it, and that a drain lifts a hold at once (retry_s is only the re-look timer)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.consumer.process_queue import FetchedBatch, FlowLimits, ProcessQueue
from mqd.topic_partition import TopicPartition

TP = TopicPartition("t", 0)
EMPTY = pa.RecordBatch.from_pydict({"offset": pa.array([], pa.int64())})

# one answer: its batches as (first_offset, records, bytes)
Answer = list[tuple[int, int, int]]


def queue(*answers: Answer) -> ProcessQueue:
    q = ProcessQueue()
    for answer in answers:
        for i, (first, count, nbytes) in enumerate(answer):
            q.append(FetchedBatch(TP, 1, EMPTY, first, first + count, nbytes), same_answer=i > 0)
    return q


LIMITS = FlowLimits(max_queued_records=10, max_queued_bytes=100, max_offset_span=20, retry_s=0.05)
NEXT = [(90, 1, 1)]  # a small newest answer, so the ones before it count


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ([], None),
        ([[(0, 10, 100)], NEXT], None),  # exactly at the record and byte thresholds
        ([[(0, 11, 1)], NEXT], "records"),
        ([[(0, 1, 101)], NEXT], "bytes"),
        ([[(0, 5, 1), (16, 5, 1)], [(21, 1, 1)]], None),  # span 20: at the threshold
        ([[(0, 5, 1), (17, 5, 1)], [(22, 1, 1)]], "span"),
        ([[(0, 11, 101)], NEXT], "records"),  # records is looked at first
        ([[(0, 1, 101)], [(30, 1, 1)], NEXT], "bytes"),  # then bytes, then span
        ([[(0, 5, 1)], [(5, 6, 1)], NEXT], "records"),  # older answers add up
        # the newest answer alone never holds, however large
        ([[(0, 5000, 10_000), (5000, 5000, 10_000)]], None),
        ([[(0, 1, 1)], [(1, 5000, 10_000)]], None),
    ],
)
def test_hold_reason(answers: list[Answer], reason: str | None) -> None:
    """Over a threshold, counting every answer but the newest, holds the partition and looks again
    retry_s later; under or at every threshold it is fetchable."""
    q = queue(*answers)
    now = 10.0
    until = q.hold(LIMITS, now)
    assert q.flow_reason == reason
    assert until == (None if reason is None else pytest.approx(now + 0.05))
    assert q.held_reason(LIMITS) == reason


def test_drain_lifts_the_hold_at_once() -> None:
    """A held partition drained is fetchable at the next look, well before retry_s has passed;
    a partial drain into the newest answer leaves it fetchable too."""
    q = queue([(0, 11, 1)], NEXT)
    assert q.hold(LIMITS, 10.0) == pytest.approx(10.05)
    q.popleft()
    assert q.hold(LIMITS, 10.001) is None
    assert q.held_reason(LIMITS) is None
    q = queue([(0, 11, 1)], [(11, 20, 1), (31, 20, 1)])
    q.popleft()
    q.popleft()  # into the newest answer
    assert (q.records, q.newest_records) == (20, 20)
    assert q.hold(LIMITS, 10.0) is None


def test_an_empty_queue_is_never_held() -> None:
    """Whatever the bookkeeping saw (here an answer older than the one before it, as a fetch asked
    twice once appended), a drained queue holds nothing back: no drain could lift that hold, and the
    partition would never be fetched again (the hot shape's stall)."""
    q = queue([(41, 11, 1)], [(30, 11, 1)])
    q.popleft()
    q.popleft()
    assert q.hold(LIMITS, 10.0) is None
    assert q.held_reason(LIMITS) is None


@given(
    st.lists(
        st.lists(st.tuples(st.integers(1, 30), st.integers(1, 60)), min_size=1, max_size=3),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 12),
)
def test_rule_is_the_thresholds_of_all_but_the_newest_answer(
    shapes: list[list[tuple[int, int]]], drained: int
) -> None:
    """After any answers and any drain from the front, the hold reason equals the thresholds
    applied to the buffered batches that came before the newest answer."""
    answers: list[Answer] = []
    offset = 0
    for shape in shapes:
        answer = []
        for count, nbytes in shape:
            answer.append((offset, count, nbytes))
            offset += count
        answers.append(answer)
    q = queue(*answers)
    for _ in range(min(drained, len(q))):
        q.popleft()
    newest_first = answers[-1][0][0]
    older = [b for b in q.batches if b.first_offset < newest_first]
    expected = None
    if older:
        if sum(b.next_offset - b.first_offset for b in older) > LIMITS.max_queued_records:
            expected = "records"
        elif sum(b.nbytes for b in older) > LIMITS.max_queued_bytes:
            expected = "bytes"
        elif older[-1].next_offset - 1 - older[0].first_offset > LIMITS.max_offset_span:
            expected = "span"
    assert q.over(LIMITS) == expected


def test_seed_defaults() -> None:
    """The seed thresholds (RocketMQ's) and the 50 ms retry are unchanged."""
    assert FlowLimits() == FlowLimits(
        max_queued_records=1000, max_queued_bytes=100 * 1024 * 1024, max_offset_span=2000, retry_s=0.05
    )
