"""The landing's cut policy (mqd.landing.micro_batches) as pure logic: when a partition's
micro-batch is due, which partitions a full sink cuts, that busy partitions are skipped, that
replayed records are cut off and that a failed publication's records go back ahead of newer ones."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from mqd.config import LandingConfig
from mqd.landing.micro_batches import MicroBatches


@dataclass(frozen=True)
class Batch:
    """A drained batch as the sink sees it (the fields of mqd.consumer.FetchedBatch it reads)."""

    tp: tuple[str, int]
    records: pa.RecordBatch
    first_offset: int
    next_offset: int
    nbytes: int
    fetched_at: float
    incarnation: str | None = None


def batch(
    partition: int, first: int, count: int, *, nbytes: int = 100, at: float = 0.0, inc: str | None = None
) -> Batch:
    rb = pa.RecordBatch.from_pydict({"offset": pa.array(range(first, first + count), pa.int64())})
    return Batch(("t", partition), rb, first, first + count, nbytes, at, inc)


def cfg(**kw: float) -> LandingConfig:
    return LandingConfig(dir=Path("unused"), **kw)  # type: ignore[arg-type]


def test_cut_by_records_bytes_and_age_skipping_busy_partitions() -> None:
    """A buffer is due at max_records, max_bytes or max_age (from its first fetch), whichever is
    first; a busy partition is never due and does not count for next_due_in."""
    mb = MicroBatches(cfg(max_records=10, max_bytes=1000, max_age=2.0))
    mb.add(batch(0, 0, 10, at=100.0))  # records
    mb.add(batch(1, 0, 1, at=100.0))  # age
    mb.add(batch(2, 0, 1, nbytes=1000, at=101.0))  # bytes
    assert sorted(mb.due(set(), now=100.5)) == [("t", 0), ("t", 2)]
    assert sorted(mb.due(set(), now=102.0)) == [("t", 0), ("t", 1), ("t", 2)]
    assert mb.due({("t", 0), ("t", 1), ("t", 2)}, now=102.0) == []
    assert mb.next_due_in({("t", 0)}, now=100.5) == pytest.approx(1.5)
    assert mb.next_due_in({("t", 0), ("t", 1), ("t", 2)}) is None


def test_a_full_sink_cuts_its_biggest_idle_buffers() -> None:
    """With buffers plus publications in flight at max_bytes, the biggest idle buffers are cut
    until the rest fits, though none of them is due on its own."""
    mb = MicroBatches(cfg(max_records=1000, max_bytes=1000, max_age=60.0))
    mb.add(batch(0, 0, 1, nbytes=300, at=100.0))
    mb.add(batch(1, 0, 1, nbytes=200, at=100.0))
    mb.add(batch(2, 0, 1, nbytes=100, at=100.0))
    assert mb.due(set(), now=100.0) == []
    mb.inflight_bytes = 500  # 1100 held: cutting the 300 is enough
    assert mb.due(set(), now=100.0) == [("t", 0)]
    mb.inflight_bytes = 800  # 1400 held: the 300 and the 200
    assert mb.due(set(), now=100.0) == [("t", 0), ("t", 1)]
    # a busy partition's buffer still counts as held, but only idle ones can be cut
    assert mb.due({("t", 0)}, now=100.0) == [("t", 1), ("t", 2)]


def test_replayed_records_are_cut_off_and_restored_ones_go_first() -> None:
    """Records at or below the last published offset, or already buffered, are not buffered again;
    records a failed publication gives back precede those drained meanwhile, keeping their age."""
    mb = MicroBatches(cfg(max_records=1000, max_bytes=10_000, max_age=5.0))
    tp = ("t", 0)
    mb.set_expected(tp, 4)
    assert mb.add(batch(0, 0, 3)) == 0
    assert mb.add(batch(0, 3, 5, at=10.0)) == 3  # 5, 6, 7
    assert mb.add(batch(0, 6, 4)) == 2  # 8, 9
    taken = mb.take(tp)
    assert taken is not None and taken.records == 5 and mb.take(tp) is None
    mb.add(batch(0, 10, 2, at=20.0))
    mb.restore(tp, taken.batches, taken.since)
    again = mb.take(tp)
    assert again is not None and again.since == 10.0 and again.next_offset == 12
    offsets = [o for rb in again.batches for o in rb.column(0).to_pylist()]
    assert offsets == list(range(5, 12))


def test_the_floor_holds_within_one_incarnation_only() -> None:
    """Landed up to 9 of incarnation OLD: OLD's replay is cut, NEW's reused offsets are kept as
    new records (after OLD's buffered ones, each batch with its incarnation), NEW's own replay is
    cut again; an unknown incarnation on either side assumes no reuse."""
    old, new = "a" * 32, "b" * 32
    mb = MicroBatches(cfg(max_records=1000, max_bytes=10_000, max_age=5.0))
    tp = ("t", 0)
    mb.set_expected(tp, 9, old)
    assert mb.add(batch(0, 5, 5, inc=old)) == 0  # a replay of OLD
    assert mb.add(batch(0, 10, 2, inc=old)) == 2  # 10, 11 of OLD
    assert mb.add(batch(0, 4, 3, inc=new)) == 3  # 4..6 of NEW: new records
    assert mb.add(batch(0, 5, 3, inc=new)) == 1  # 5, 6 buffered already: 7 only
    assert mb.add(batch(0, 0, 8)) == 0  # unknown incarnation: below what is buffered
    taken = mb.take(tp)
    assert taken is not None and taken.incarnations == [old, new, new]
    assert [rb.column(0).to_pylist() for rb in taken.batches] == [[10, 11], [4, 5, 6], [7]]
    mb.set_expected(tp, 9, None)  # landed before incarnations: no reuse assumed
    assert mb.add(batch(0, 8, 4, inc=new)) == 2


def test_publish_lead_follows_publications_and_is_capped() -> None:
    """The age cut moves earlier by the smoothed publish time plus four deviations, at most half
    of max_age."""
    mb = MicroBatches(cfg(max_age=1.0))
    assert mb.publish_lead == 0.0
    mb.observe_publish(0.1)
    assert mb.publish_lead == pytest.approx(0.1 + 4 * 0.05)
    for _ in range(20):
        mb.observe_publish(30.0)
    assert mb.publish_lead == pytest.approx(0.5)


def test_memory_pressure_cuts_the_biggest_buffers_enough_to_free_the_need() -> None:
    """Under memory pressure only the biggest idle buffers are cut, biggest first, until they
    hold the bytes needed; busy buffers are skipped and a need larger than all cuts every one."""
    mb = MicroBatches(cfg(max_records=1000, max_bytes=10_000, max_age=60.0))
    for p, nbytes in enumerate([300, 500, 100, 200]):
        mb.add(batch(p, 0, 1, nbytes=nbytes, at=100.0))
    assert mb.biggest(set(), 1) == [("t", 1)]
    assert mb.biggest(set(), 500) == [("t", 1)]
    assert mb.biggest(set(), 501) == [("t", 1), ("t", 0)]
    assert mb.biggest({("t", 1)}, 301) == [("t", 0), ("t", 3)]
    assert mb.biggest(set(), 10**9) == [("t", 1), ("t", 0), ("t", 3), ("t", 2)]
    assert mb.biggest(set(p for p in [("t", 0), ("t", 1), ("t", 2), ("t", 3)]), 1) == []
