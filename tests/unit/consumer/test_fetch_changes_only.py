"""``changes_only`` fetches (docs/protocol.md): which planned entries the broker may leave out, and
how the consumer's answer callback treats a partition the answer left out (no news, still owned).
Real answers framed with mqd.wire.protocol; no broker."""

from __future__ import annotations

from typing import Any

from mqd import metrics
from mqd.broker.fetch_plan import FetchItem, unchanged
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager, _Sent
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.wire.metadata import ClusterMetadata
from mqd.wire.protocol import PartitionHeader, Status, decode_fetch_answer, encode_fetch_answer

INC = "9f1c2e0a4b7d4e8f9a0b1c2d3e4f5a6b"
OTHER = "0" * 32
TP = TopicPartition("events", 0)
LAYOUT = {
    "groups": [
        {
            "name": "broker-a",
            "nodes": [{"id": "m", "url": "http://127.0.0.1:1", "role": "master", "alive": True}],
        }
    ],
    "topics": [
        {
            "name": "events",
            "partitions": [{"partition": 0, "group": "broker-a", "master": "m", "replicas": []}],
        }
    ],
}


def entry(**kw: Any) -> PartitionHeader:
    e: dict[str, Any] = {
        "topic": "events",
        "partition": 0,
        "status": Status.OFFSET_OVERFLOW_ONE,
        "next_offset": 7,
        "min_offset": 0,
        "max_offset": 7,
        "suggest": None,
        "incarnation": INC,
    }
    e.update(kw)
    e["status"] = Status(e["status"])
    return PartitionHeader(**e)


def test_only_a_partition_with_nothing_new_is_left_out() -> None:
    """Left out: at the log end (or an empty log at 0) under the incarnation asked for, nothing to
    suggest, no error. Kept: an unknown or other incarnation, any other status, an offset that is
    not the log end, a suggestion, an error."""
    at_end = FetchItem("events", 0, 7, 1024, INC)
    assert unchanged(at_end, entry())
    assert unchanged(
        FetchItem("events", 0, 0, 1024, INC),
        entry(status="NO_MESSAGE_IN_QUEUE", next_offset=0, max_offset=0),
    )
    assert not unchanged(FetchItem("events", 0, 7, 1024, None), entry())  # the consumer adopts it
    assert not unchanged(at_end, entry(incarnation=OTHER))
    assert not unchanged(at_end, entry(status="FOUND"))
    assert not unchanged(at_end, entry(status="OFFSET_OVERFLOW_BADLY", next_offset=0))
    assert not unchanged(at_end, entry(max_offset=9))
    assert not unchanged(at_end, entry(suggest="s"))
    assert not unchanged(at_end, entry(status="NOT_SERVED", error="unknown_partition"))
    assert not unchanged(FetchItem("events", 0, 5, 1024, INC), entry(next_offset=5))


def manager() -> FetchManager:
    config = ConsumerConfig(error_backoff_ms=10, bootstrap=["http://127.0.0.1:1"])
    source = MqdBrokerSource(config)
    source.metadata.current = ClusterMetadata.parse(LAYOUT)
    state = SubscriptionState(FlowLimits(), ByteBudget(config.max_buffered_bytes))
    return FetchManager(config=config, source=source, state=state)


def empty_answer() -> Any:
    return MqdBrokerSource._result(decode_fetch_answer(b"".join(encode_fetch_answer("m", [], []))))


def unchanged_count() -> float:
    return metrics.fetch_partitions_unchanged.labels("m")._value.get()  # type: ignore[no-any-return]


def test_a_partition_left_out_is_no_news_and_still_owned() -> None:
    """An answer without the partition: it stays owned at its position, no error is recorded, an
    earlier error streak ends (as on an answer at the log end), and the metric counts it."""
    m = manager()
    op = m.state.assign(TP, 7, "m", INC)
    op.errors, op.last_error = 2, "m: timeout"
    before = unchanged_count()
    m.handle_answer("m", empty_answer(), [_Sent(op, op.epoch, 7, INC)])
    assert m.state.partitions[TP] is op
    assert (op.position, op.incarnation, op.parked, op.errors) == (7, INC, None, 0)
    assert op.last_error is None
    assert op.retry_at == 0.0
    assert unchanged_count() == before + 1


def test_a_left_out_partition_that_moved_on_is_not_touched() -> None:
    """Seeked or paused while the fetch was out: the answer's silence says nothing about it now;
    a parked partition keeps its reason."""
    m = manager()
    op = m.state.assign(TP, 7, "m", INC)
    epoch = op.epoch
    m.state.seek(TP, 3)
    op.errors, op.last_error = 1, "m: timeout"
    m.handle_answer("m", empty_answer(), [_Sent(op, epoch, 7, INC)])
    assert (op.errors, op.last_error) == (1, "m: timeout")
    op.paused = True
    m.handle_answer("m", empty_answer(), [_Sent(op, op.epoch, 3, INC)])
    assert op.errors == 1
    op.paused = False
    op.parked, op.last_error = "policy", "why"
    m.handle_answer("m", empty_answer(), [_Sent(op, op.epoch, 3, INC)])
    assert (op.parked, op.last_error, op.errors) == ("policy", "why", 0)
