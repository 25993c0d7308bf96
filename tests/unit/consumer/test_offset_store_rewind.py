"""The offset store's rewind (mqd.consumer.offset_store.OffsetStore.rewind): a partition's log replaced
from an offset on (a new log incarnation) moves its mark back there, the lower mark is persisted
(both stores), and late marks of the old log's records, fetched before the change and published
after it, are ignored; the engine calls it from the fetcher's INCARNATION_CHANGED handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager, _Sent
from mqd.consumer.offset_store import CoordinatorOffsetStore, LocalFileOffsetStore
from mqd.consumer.source import Decoded, FetchResult, FetchStatus, PartitionResult
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.wire.metadata import ClusterMetadata

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


class Coordinator(CoordinatorOffsetStore):
    """A coordinator that stores whatever is committed, lower or not (Kafka's way)."""

    def __init__(self) -> None:
        super().__init__()
        self.stored: dict[TopicPartition, int] = {}
        self.commits: list[dict[TopicPartition, int]] = []
        self.gate: asyncio.Event | None = None  # a commit waits for it (a write in flight)

    async def _read_committed(self, tps: list[TopicPartition]) -> Iterable[tuple[TopicPartition, int]]:
        return [(tp, self.stored.get(tp, -1)) for tp in tps]

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        if self.gate is not None:
            await self.gate.wait()
        self.stored.update(offsets)


class ForwardOnlyCoordinator(Coordinator):
    """A coordinator that ignores a commit below what it holds (the mqd broker's, unforced)."""

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        for tp, off in offsets.items():
            self.stored[tp] = max(off, self.stored.get(tp, -1))


async def landed_and_committed(store: Coordinator, marks: int = 40) -> None:
    """Marked and committed up to ``marks`` under the old log."""
    store.mark(TP, marks)
    assert await store.persist() == 1
    assert (store.marked(TP), store.committed(TP), store.stored[TP]) == (marks, marks, marks)


async def test_a_rewind_moves_the_mark_back_and_persists_the_lower_offset() -> None:
    """Everything of the old log landed and committed (40); the log is replaced from 0: the mark is
    0 at once and committed as 0 (lower than before, on the coordinator too); the new log's marks
    move it forward from there; another partition is untouched."""
    store = Coordinator()
    await landed_and_committed(store)
    store.mark(OTHER, 7)
    store.rewind(TP, 0, 40)
    assert (store.marked(TP), store.committed(TP)) == (0, 40)  # committed: the truth until persisted
    assert store.pending() == {TP: 0, OTHER: 7}
    assert await store.persist() == 2
    assert (store.committed(TP), store.stored[TP], store.stored[OTHER]) == (0, 0, 7)
    assert store.pending() == {}
    store.mark(TP, 10)
    assert await store.persist() == 1
    assert (store.marked(TP), store.committed(TP), store.stored[TP]) == (10, 10, 10)
    store.mark(TP, 5)  # forward-only again within the new log
    assert (store.marked(TP), store.pending()) == (10, {})


async def test_a_coordinator_that_keeps_the_higher_offset_is_read_back() -> None:
    """The mqd broker's coordinator ignores the rewound 0 below its 40: read back, committed says
    40 (the truth), nothing is pending, and marks are committed again once past 40."""
    store = ForwardOnlyCoordinator()
    await landed_and_committed(store)
    store.rewind(TP, 0, 40)
    assert await store.persist() == 1
    assert (store.marked(TP), store.committed(TP), store.stored[TP], store.pending()) == (0, 40, 40, {})
    store.mark(TP, 30)
    assert store.pending() == {}
    store.mark(TP, 45)
    assert await store.persist() == 1
    assert (store.committed(TP), store.stored[TP]) == (45, 45)


async def test_late_marks_of_the_old_log_are_ignored_after_the_rewind() -> None:
    """Landed up to 30 of an old log fetched up to 40; the log is replaced from 0 while the old
    records 30..39 are still being published: their marks (35, then 40) come after the rewind and
    must not move the mark up to the old end. The new log's first mark (12, below what the old log
    had marked) is taken, and the old log's range is no longer watched (a mark of 35 now is the new
    log's)."""
    store = Coordinator()
    await landed_and_committed(store, 30)
    store.rewind(TP, 0, 40)
    assert store.marked(TP) == 0
    store.mark(TP, 35)
    store.mark(TP, 40)
    assert store.marked(TP) == 0
    assert await store.persist() == 1
    assert store.stored[TP] == 0
    store.mark(TP, 12)
    store.mark(TP, 35)
    assert store.marked(TP) == 35


def test_a_late_old_mark_ending_the_old_log_ends_the_watch() -> None:
    """The old log's last fetched record's mark (40 = the old end) is ignored and nothing of the
    old log follows it: the new log's next mark, 33 (within the old range), is taken."""
    store = Coordinator()
    store.mark(TP, 30)
    store.rewind(TP, 0, 40)
    store.mark(TP, 40)
    store.mark(TP, 33)
    assert store.marked(TP) == 33


def test_a_new_mark_beyond_the_old_end_is_taken_and_ends_the_watch() -> None:
    """A mark past the old log's fetched end cannot be the old log's: taken (the new log is longer);
    a later smaller mark is a plain backward mark again (ignored)."""
    store = Coordinator()
    store.mark(TP, 30)
    store.rewind(TP, 0, 40)
    store.mark(TP, 55)
    store.mark(TP, 35)
    assert store.marked(TP) == 55


def test_a_truncation_above_the_mark_keeps_it_and_ignores_old_marks_past_the_cut() -> None:
    """Truncated at 35 with 30 marked and 40 fetched: the mark stays 30 (nothing to rewind, nothing
    to persist lower); a late mark of 33 is the same records in both logs (taken), one of 38 is
    past the cut (ignored); the new log's 36 after it is in the old range as well, so it waits for
    one beyond the old end (its lag overstated meanwhile, never understated)."""
    store = Coordinator()
    store.mark(TP, 30)
    store.rewind(TP, 35, 40)
    assert (store.marked(TP), store.pending()) == (30, {TP: 30})  # 30 was never persisted
    store.mark(TP, 33)
    assert store.marked(TP) == 33
    store.mark(TP, 38)
    assert store.marked(TP) == 33
    store.mark(TP, 39)
    assert store.marked(TP) == 33
    store.mark(TP, 41)
    assert store.marked(TP) == 41


def test_a_rewind_with_nothing_of_the_old_log_in_flight_watches_nothing() -> None:
    """Everything fetched of the old log was marked (40 of 40): no mark can be a late one, so the new
    log's 25 is taken at once. Nothing marked at all: the rewind marks nothing (a caller that never
    marks commits nothing) but still ignores the old log's marks past the cut."""
    store = Coordinator()
    store.mark(TP, 40)
    store.rewind(TP, 0, 40)
    store.mark(TP, 25)
    assert store.marked(TP) == 25
    store.rewind(OTHER, 0, 40)
    assert (store.marked(OTHER), store.pending()) == (None, {TP: 25})
    store.mark(OTHER, 20)
    assert store.marked(OTHER) is None


async def test_a_rewind_while_a_commit_of_the_old_mark_is_in_flight_is_persisted_after_it() -> None:
    """The old mark 40's commit is on its way when the log is replaced: once it returns, the store
    knows 40 is what the coordinator holds, and the rewound 0 is still pending and committed next
    (one commit at a time, in order, so the coordinator ends at 0)."""
    store = Coordinator()
    store.mark(TP, 40)
    store.gate = asyncio.Event()
    commit = asyncio.create_task(store.persist())
    await asyncio.sleep(0)
    assert store.commits == [{TP: 40}]
    store.rewind(TP, 0, 40)
    store.gate.set()
    assert await asyncio.wait_for(commit, 5) == 1
    assert (store.committed(TP), store.pending()) == (40, {TP: 0})
    assert await store.persist() == 1
    assert (store.committed(TP), store.stored[TP], store.pending()) == (0, 0, {})


def test_forget_drops_the_watch_and_keeps_a_pending_rewound_mark() -> None:
    """A revoked partition: its rewound mark is not persisted yet, so it is kept; the old log's
    watch ends (a new assignment starts from the landing)."""
    store = Coordinator()
    store._persisted[TP] = 30
    store.mark(TP, 30)
    store.rewind(TP, 0, 40)
    store.forget([TP])
    assert store.pending() == {TP: 0}
    store.mark(TP, 35)
    assert store.marked(TP) == 35


async def test_the_local_file_store_writes_the_lower_offset(tmp_path: Path) -> None:
    """Broadcast mode: the rewound mark is written to the offset file although lower."""
    path = tmp_path / "offsets.json"
    store = LocalFileOffsetStore(path)
    await store.start()
    store.mark(TP, 30)
    await store.persist()
    store.rewind(TP, 0, 40)
    store.mark(TP, 40)  # late, of the old log
    assert await store.persist() == 1
    assert json.loads(path.read_text())["offsets"] == {"t": {"0": 0}}
    assert store.committed(TP) == 0
    reread = LocalFileOffsetStore(path)
    await reread.start()
    assert await reread.load([TP]) == {TP: 0}


def test_rewind_refuses_negative_offsets() -> None:
    with pytest.raises(ValueError):
        Coordinator().rewind(TP, -1, 3)


LAYOUT = {
    "groups": [
        {"name": "a", "nodes": [{"id": "m", "url": "http://127.0.0.1:1", "role": "master", "alive": True}]}
    ],
    "topics": [{"name": "t", "partitions": [{"partition": 0, "group": "a", "master": "m", "replicas": []}]}],
}


def _no_data(start: int, check_crc: bool) -> Decoded:
    raise AssertionError("an INCARNATION_CHANGED answer is never decoded")


def test_the_fetcher_rewinds_the_store_where_the_logs_part() -> None:
    """INCARNATION_CHANGED below the position (diverged at 4, fetched to 10) rewinds the store to 4
    with the old end 10; one at or above the position (nothing fetched is affected) does not."""
    config = ConsumerConfig(error_backoff_ms=10, bootstrap=["http://127.0.0.1:1"])
    source = MqdBrokerSource(config)
    source.metadata.current = ClusterMetadata.parse(LAYOUT)
    m = FetchManager(config=config, source=source, state=SubscriptionState(FlowLimits(), ByteBudget(1 << 20)))
    calls: list[tuple[TopicPartition, int, int]] = []
    m.on_rewind = lambda tp, to, old_end: calls.append((tp, to, old_end))
    op = m.state.assign(TP, 10, "m", "1" * 32)

    def changed(incarnation: str, diverged_at: int) -> None:
        res = PartitionResult(
            tp=TP,
            status=FetchStatus.INCARNATION_CHANGED,
            next_offset=diverged_at,
            log_start=0,
            log_end=100,
            suggested_node=None,
            incarnation=incarnation,
            error=None,
            decode=_no_data,
            diverged_at=diverged_at,
        )
        sent = [_Sent(op, op.epoch, op.position, op.incarnation)]
        m.handle_answer("m", FetchResult([res], body=b"", nbytes=0), sent)

    changed("2" * 32, 4)
    assert (op.position, calls) == (4, [(TP, 4, 10)])
    changed("3" * 32, 4)
    assert (op.incarnation, calls) == ("3" * 32, [(TP, 4, 10)])
