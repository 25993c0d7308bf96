"""The engine's log-incarnation rule as pure logic (mqd.consumer.fetcher): source-neutral answers
(mqd.consumer.source.PartitionResult) with real batches from mqd.wire.format, no broker.

A partition's position belongs to a log incarnation. The first one seen is adopted without assuming
any reuse; INCARNATION_CHANGED with diverged_at >= position adopts the new one where it is; with
diverged_at below the position, the offsets in between were fetched under the old log and the new
one holds other records there: counted, logged, and fetched again under the new incarnation.
DATA_LOST counts the hole and continues after it. Batches carry the incarnation they came from."""

from __future__ import annotations

import functools
from typing import Any

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager, _Sent
from mqd.consumer.source import FetchResult, FetchStatus, PartitionResult
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.sources.mqd_broker.decode import decode_batches
from mqd.wire import format
from mqd.wire.metadata import ClusterMetadata

TP = TopicPartition("inc", 0)
OLD = "1" * 32  # the old incarnation (OLD)
NEW = "2" * 32  # the new one (NEW)
LAYOUT = {
    "groups": [
        {"name": "a", "nodes": [{"id": "m", "url": "http://127.0.0.1:1", "role": "master", "alive": True}]}
    ],
    "topics": [
        {"name": "inc", "partitions": [{"partition": 0, "group": "a", "master": "m", "replicas": []}]}
    ],
}


def manager() -> FetchManager:
    config = ConsumerConfig(error_backoff_ms=10, bootstrap=["http://127.0.0.1:1"])
    source = MqdBrokerSource(config)
    source.metadata.current = ClusterMetadata.parse(LAYOUT)
    state = SubscriptionState(FlowLimits(), ByteBudget(config.max_buffered_bytes))
    return FetchManager(config=config, source=source, state=state)


def result(status: FetchStatus, next_offset: int, data: bytes = b"", **kw: Any) -> FetchResult:
    view = memoryview(data)
    res = PartitionResult(
        tp=TP,
        status=status,
        next_offset=next_offset,
        log_start=0,
        log_end=kw.pop("log_end", 100),
        suggested_node=None,
        incarnation=kw.pop("incarnation", None),
        error=None,
        decode=functools.partial(decode_batches, view),
        **kw,
    )
    return FetchResult([res], body=data, nbytes=len(data))


def deliver(m: FetchManager, res: FetchResult) -> Any:
    """One answer for the partition at its current position, with the incarnation it names."""
    op = m.state.partitions[TP]
    m.handle_answer("m", res, [_Sent(op, op.epoch, op.position, op.incarnation)])
    return op


def records(base: int, n: int) -> bytes:
    return format.encode_batch([str(o).encode() for o in range(base, base + n)], base_offset=base)


def drained(m: FetchManager) -> list[tuple[str | None, list[int]]]:
    return [(b.incarnation, b.records.column("offset").to_pylist()) for b in m.state.drain()]


def test_first_incarnation_is_adopted_without_assuming_reuse() -> None:
    """A position of an unknown incarnation adopts the first answer's; its batches carry it and
    nothing is counted as a change."""
    m = manager()
    m.state.assign(TP, 0, "m")
    op = deliver(m, result(FetchStatus.FOUND, 3, records(0, 3), incarnation=OLD))
    assert (op.incarnation, op.position, op.incarnation_changes, op.reused_offsets) == (OLD, 3, 0, 0)
    assert drained(m) == [(OLD, [0, 1, 2])]


def test_changed_incarnation_below_the_position_refetches_the_reused_offsets_as_new_records() -> None:
    """Position 10 under I; the log is now NEW, diverged at 4: offsets 4..9 were fetched under I
    and J holds other records there. The partition moves to 4 under J (no seek: what is buffered
    of I stays and lands as I), 6 reused offsets and one change are counted, the error says both
    incarnations and the offsets, and J's records come with J."""
    m = manager()
    m.state.assign(TP, 0, "m", OLD)
    deliver(m, result(FetchStatus.FOUND, 10, records(0, 10), incarnation=OLD))
    epoch = m.state.partitions[TP].epoch
    before = metrics.reused_offsets.labels(TP.topic, "0")._value.get()
    op = deliver(m, result(FetchStatus.INCARNATION_CHANGED, 10, incarnation=NEW, diverged_at=4))
    assert (op.incarnation, op.position, op.epoch) == (NEW, 4, epoch)
    assert (op.incarnation_changes, op.reused_offsets) == (1, 6)
    assert (m.incarnation_changes, m.reused_offsets) == (1, 6)
    assert metrics.reused_offsets.labels(TP.topic, "0")._value.get() - before == 6
    assert (
        op.last_error is not None
        and OLD in op.last_error
        and NEW in op.last_error
        and "4..9" in op.last_error
    )
    deliver(m, result(FetchStatus.FOUND, 7, records(4, 3), incarnation=NEW))
    assert drained(m) == [(OLD, list(range(10))), (NEW, [4, 5, 6])]


def test_changed_incarnation_at_or_above_the_position_affects_nothing() -> None:
    """Diverged at 10 with position 10 (the old log was only cut above what we fetched): the new
    incarnation is adopted where we are; nothing is reused."""
    m = manager()
    m.state.assign(TP, 10, "m", OLD)
    op = deliver(m, result(FetchStatus.INCARNATION_CHANGED, 10, incarnation=NEW, diverged_at=10))
    assert (op.incarnation, op.position, op.incarnation_changes, op.reused_offsets) == (NEW, 10, 1, 0)


def test_unknown_old_incarnation_means_everything_fetched_is_reused() -> None:
    """A log that never held our incarnation (a rebuilt cluster) diverges at 0: everything before
    the position is fetched again under the new incarnation."""
    m = manager()
    m.state.assign(TP, 1000, "m", OLD)
    op = deliver(m, result(FetchStatus.INCARNATION_CHANGED, 1000, incarnation=NEW, diverged_at=0))
    assert (op.incarnation, op.position, op.reused_offsets) == (NEW, 0, 1000)


def test_data_lost_counts_the_hole_and_continues_after_it() -> None:
    """DATA_LOST at 5 for the fenced hole 5..9: 5 offsets counted lost, the error names the
    range, and fetching continues at 10."""
    m = manager()
    m.state.assign(TP, 5, "m", OLD)
    op = deliver(m, result(FetchStatus.DATA_LOST, 10, incarnation=OLD, lost_first=5, lost_last=9, log_end=20))
    assert (op.position, op.lost_offsets, m.lost_offsets) == (10, 5, 5)
    assert op.last_error is not None and "5..9" in op.last_error


def test_records_of_another_incarnation_are_never_tagged_with_ours() -> None:
    """A FOUND answer whose incarnation is not the one the fetch named (a source that should have
    answered INCARNATION_CHANGED) is an error: nothing is appended, the position stays."""
    m = manager()
    m.state.assign(TP, 0, "m", OLD)
    op = deliver(m, result(FetchStatus.FOUND, 3, records(0, 3), incarnation=NEW))
    assert (op.position, op.incarnation, drained(m)) == (0, OLD, [])
    assert op.last_error is not None and NEW in op.last_error
