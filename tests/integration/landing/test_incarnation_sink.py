"""The landing sink with log incarnations, on a real directory: records cut at the landed floor are
counted and logged (they used to vanish silently), and a micro-batch holding the end of one
incarnation and the reused offsets of the next lands both, as separate files keyed by incarnation,
with the head on the new one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import structlog
from support.landing import resume, resume_position

from mqd import metrics
from mqd.config import LandingConfig
from mqd.consumer import FetchedBatch, TopicPartition
from mqd.landing import LandingSink
from mqd.wire import format as fmt

T0 = 1_767_225_600_000
OLD, NEW = "e" * 32, "f" * 32


def fetched(tp: TopicPartition, first: int, count: int, inc: str | None) -> FetchedBatch:
    raw = fmt.encode_batch(
        [f"{inc}:{first + i}".encode() for i in range(count)],
        timestamps=np.full(count, T0, dtype=np.int64),
        base_offset=first,
    )
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    batch = FetchedBatch(tp, 1, rb, first, first + count, len(raw))
    return batch if inc is None else dataclasses.replace(batch, incarnation=inc)


async def test_records_cut_at_the_landed_floor_are_counted_and_logged(tmp_path: Path) -> None:
    """0..9 landed; a replay of 5..14 keeps 10..14 and cuts 5 records: the sink's stats, its status
    and the metric count them, and a warning names the partition and the range."""
    tp = TopicPartition("cut", 0)
    sink = LandingSink(LandingConfig(dir=tmp_path / "landing"))
    await sink.start()
    await resume_position(sink, tp)
    sink.add(fetched(tp, 0, 10, None))
    await sink.publish()
    before = metrics.REGISTRY.get_sample_value("mqd_cut_records_total", {"topic": "cut"}) or 0.0
    with structlog.testing.capture_logs() as logs:
        kept = sink.add(fetched(tp, 5, 10, None))
    await sink.close()
    assert kept == 5
    assert metrics.REGISTRY.get_sample_value("mqd_cut_records_total", {"topic": "cut"}) == before + 5
    assert sink.stats.cut == 5 and sink.status()["cut"] == 5
    [line] = [e for e in logs if e["event"].startswith("records already landed")]
    assert (line["partition"], line["first_offset"], line["cut"], line["landed_last"]) == (0, 5, 5, 9)


async def test_a_new_incarnation_lands_beside_the_old_one(tmp_path: Path) -> None:
    """Landed 0..9 of OLD; buffered 10..11 of OLD, then NEW from 4 (the log was cut at 4 and written
    again). One publication lands OLD's 10..11 and NEW's 4..7 as two files named by incarnation;
    every record is in the landing once, with its incarnation column, and a restart resumes at 8
    of NEW."""
    tp = TopicPartition("re", 0)
    root = tmp_path / "landing"
    sink = LandingSink(LandingConfig(dir=root))
    await sink.start()
    await resume_position(sink, tp)
    sink.add(fetched(tp, 0, 10, OLD))
    await sink.publish()
    sink.add(fetched(tp, 10, 2, OLD))
    sink.add(fetched(tp, 4, 4, NEW))
    [res] = await sink.publish()
    assert res.conflict is None and res.error is None
    assert [(r.incarnation, r.first_offset, r.last_offset) for r in res.published] == [
        (OLD, 10, 11),
        (NEW, 4, 7),
    ]
    rows = sorted(
        (inc, off)
        for path in root.rglob("part-*.parquet")
        for inc, off in zip(
            pq.read_table(path).column("incarnation").to_pylist(),
            pq.read_table(path).column("offset").to_pylist(),
            strict=True,
        )
    )
    assert rows == sorted([(OLD, o) for o in range(12)] + [(NEW, o) for o in range(4, 8)])
    await sink.close()
    again = LandingSink(LandingConfig(dir=root))
    await again.start()
    assert await resume(again, tp) == (8, NEW)
    await again.close()
