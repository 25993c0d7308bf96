"""Landing sink and publisher: atomic, conditional, resumable publication into a real directory."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.landing import read_manifest, read_watermarks, resume_position, update_markers

from mqd.config import LandingConfig
from mqd.consumer import FetchedBatch, TopicPartition
from mqd.landing import LandingSink, LocalStore, Publisher, layout
from mqd.landing.errors import LandingCorrupt, LandingError, PublishConflict
from mqd.landing.local_objects import LocalObjects
from mqd.waiting import wait_until
from mqd.wire import format as fmt

HOUR = layout.HOUR_MS
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def fetched(topic: str, partition: int, first: int, count: int, ts: int | np.ndarray = T0) -> FetchedBatch:
    """A real batch through the wire format, as the consumer hands it over."""
    tss = np.full(count, ts, dtype=np.int64) if isinstance(ts, int) else ts
    raw = fmt.encode_batch(
        [f"v{first + i}".encode() for i in range(count)],
        keys=[b"k"] * count,
        timestamps=tss,
        headers=[[("h", b"x")]] * count,
        base_offset=first,
    )
    info = fmt.scan(raw)[0]
    rb = fmt.to_arrow(raw, info)
    return FetchedBatch(TopicPartition(topic, partition), 1, rb, first, first + count, len(raw))


def landed_offsets(root: Path, topic: str, partition: int) -> list[int]:
    out: list[int] = []
    for path in sorted((root / f"topic={topic}").glob(f"dt=*/hour=*/part-{partition:05d}-*.parquet")):
        out.extend(pq.read_table(path, columns=["offset"]).column("offset").to_pylist())
    return sorted(out)


def cfg(tmp_path: Path, **kw: Any) -> LandingConfig:
    return LandingConfig(dir=tmp_path / "landing", **kw)


async def test_publish_is_atomic_hive_laid_out_and_described(tmp_path: Path) -> None:
    """Records spanning two hours become two files in hive folders with the landing columns, their
    offset range in the file metadata and the manifest, and no temp file left behind."""
    sink = LandingSink(cfg(tmp_path))
    await sink.start()
    tp = TopicPartition("events", 3)
    assert await resume_position(sink, tp) is None
    ts = np.array([T0 + HOUR - 2, T0 + HOUR - 1, T0 + HOUR, T0 + HOUR + 5], dtype=np.int64)
    sink.add(fetched("events", 3, 0, 4, ts))
    [res] = await sink.publish()
    await sink.close()
    assert res.conflict is None and res.error is None and res.next_offset == 4
    root = tmp_path / "landing"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.parquet"))
    assert files == [
        "topic=events/dt=2026-01-01/hour=00/part-00003-00000000000000000000.parquet",
        "topic=events/dt=2026-01-01/hour=01/part-00003-00000000000000000002.parquet",
    ]
    assert not [p for p in root.rglob(".*") if p.is_file() and "_state" not in p.parts]
    t = pq.read_table(root / files[1])
    assert t.column_names == [
        "topic",
        "partition",
        "incarnation",
        "offset",
        "timestamp",
        "key",
        "value",
        "headers",
    ]
    assert t.column("topic").to_pylist() == ["events", "events"]
    assert t.column("partition").to_pylist() == [3, 3]
    assert t.column("value").to_pylist() == [b"v2", b"v3"]
    assert t.column("headers").to_pylist()[0] == [{"key": "h", "value": b"x"}]
    [rng] = layout.read_ranges(root / files[1])
    assert (rng.first_offset, rng.last_offset, rng.count, rng.ts_min, rng.ts_max) == (
        2,
        3,
        2,
        T0 + HOUR,
        T0 + HOUR + 5,
    )
    manifest = read_manifest(root)
    assert [m.path for m in manifest] == files
    assert manifest[1].bytes == (root / files[1]).stat().st_size


async def test_conditional_publication_between_two_sinks(tmp_path: Path) -> None:
    """Two sinks on one directory that both own a partition never publish an offset twice: the
    loser sees a conflict, drops its batch, and continues after the winner's last offset."""
    a, b = LandingSink(cfg(tmp_path)), LandingSink(cfg(tmp_path))
    tp = TopicPartition("events", 0)
    for s in (a, b):
        await s.start()
        assert await resume_position(s, tp) is None
    a.add(fetched("events", 0, 0, 100))
    b.add(fetched("events", 0, 0, 60))
    [ra] = await a.publish()
    [rb] = await b.publish()
    assert ra.next_offset == 100 and ra.conflict is None
    assert rb.conflict is not None and rb.conflict.last_offset == 99 and not rb.published
    assert b.pending_records == 0 and b.expected(tp) == 99
    # b re-seeks to 100 and wins the next range; a, still at 99, loses that one
    b.add(fetched("events", 0, 100, 50))
    a.add(fetched("events", 0, 100, 50))
    [rb2] = await b.publish()
    [ra2] = await a.publish()
    assert rb2.next_offset == 150 and ra2.conflict is not None and ra2.conflict.last_offset == 149
    # replayed records at or below what is published are cut, not published again
    a.add(fetched("events", 0, 140, 20))
    [ra3] = await a.publish()
    assert [(r.first_offset, r.last_offset) for r in ra3.published] == [(150, 159)]
    await a.close()
    await b.close()
    assert landed_offsets(tmp_path / "landing", "events", 0) == list(range(160))
    assert b.stats.conflicts == 1 and a.stats.conflicts == 1


def _race(root: str, rounds: int, out: Any) -> None:
    pub = Publisher(LocalStore(Path(root)))
    won = 0
    for _ in range(rounds):
        last = pub.store.head("events", 1).last_offset
        first = 0 if last is None else last + 1
        rb = fetched("events", 1, first, 10).records
        try:
            pub.publish("events", 1, pa.Table.from_batches([rb]), last)
            won += 1
        except PublishConflict:
            pass
    out.put(won)


def test_conditional_publication_across_processes(tmp_path: Path) -> None:
    """Two processes racing to publish the same partition (the claim chain) leave a dense,
    duplicate-free offset sequence, and every win is counted once."""
    root = tmp_path / "landing"
    LocalStore(root).open()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(root), 25, q)) for _ in range(2)]
    for p in procs:
        p.start()
    wins = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    offsets = landed_offsets(root, "events", 1)
    assert offsets == list(range(10 * sum(wins)))
    assert sum(wins) >= 25
    assert len(read_manifest(root)) == sum(wins)


async def test_resume_position_survives_restart_and_lost_state(tmp_path: Path) -> None:
    """A new sink resumes after the last published offset, read from the claim chain; losing the
    idle-watermark record changes nothing but the idle part of the watermark (the chain's head
    carries the published one)."""
    s = LandingSink(cfg(tmp_path))
    await s.start()
    tp = TopicPartition("events", 2)
    await resume_position(s, tp)
    s.add(fetched("events", 2, 0, 10))
    await s.publish()
    s.add(fetched("events", 2, 10, 5, T0 + 3 * HOUR))
    await s.publish()
    await s.close()
    root = tmp_path / "landing"
    state_file = root / "_state/events/00002.json"
    for lose in ([], [state_file]):
        for f in lose:
            f.unlink(missing_ok=True)
        s2 = LandingSink(cfg(tmp_path))
        await s2.start()
        assert await resume_position(s2, tp) == 15
        await s2.close()
    assert len(read_manifest(root)) == 2
    assert read_watermarks(root, "events", 3)[2] == T0 + 3 * HOUR


class _Crash(BaseException):
    """The publishing process died here."""


class _CrashOnCopy(LocalObjects):
    """A directory whose server-side copy (the promotion of a claimed file) never happens: the
    process dies right after its claim."""

    def copy(self, src: str, dst: str) -> bool:
        raise _Crash(f"{src} -> {dst}")


def test_half_done_publication_is_completed(tmp_path: Path) -> None:
    """A process that died after claiming a range but before promoting its file: the next reader
    of the partition's head promotes the staged file, and the range is in the manifest once."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    rb = fetched("events", 0, 0, 10).records
    pub.publish("events", 0, pa.Table.from_batches([rb]), None)
    dying = LocalStore(root)
    dying.objects = _CrashOnCopy(root)
    with pytest.raises(_Crash):
        Publisher(dying).publish("events", 0, pa.Table.from_batches([fetched("events", 0, 10, 5).records]), 9)
    second = "topic=events/dt=2026-01-01/hour=00/part-00000-00000000000000000010.parquet"  # 10..14
    assert second not in pub.store.visible_files()
    fresh = LocalStore(root)
    assert fresh.head("events", 0).last_offset == 14
    assert second in fresh.visible_files()
    assert [r.path for r in read_manifest(root)] == [
        "topic=events/dt=2026-01-01/hour=00/part-00000-00000000000000000000.parquet",
        second,
    ]
    with pytest.raises(PublishConflict):
        Publisher(fresh).publish("events", 0, pa.Table.from_batches([rb]), 9)


async def test_micro_batch_cut_by_records_bytes_and_age(tmp_path: Path) -> None:
    """A buffer is cut at max_records, at max_bytes, or once its oldest record is max_age old,
    so an idle partition's last records still land."""
    s = LandingSink(cfg(tmp_path, max_records=10, max_bytes=10_000, max_age=2.0))
    a, b, c = (TopicPartition("events", i) for i in range(3))
    s.add(fetched("events", 0, 0, 10), now=100.0)  # records
    s.add(fetched("events", 1, 0, 1), now=100.0)  # age
    big = fetched("events", 2, 0, 2)
    s.add(FetchedBatch(c, 1, big.records, 0, 2, 20_000), now=101.5)  # bytes
    assert sorted(s.due(now=101.9)) == [a, c]
    assert s.next_due_in(now=101.0) == pytest.approx(1.0)
    assert sorted(s.due(now=102.0)) == [a, b, c]
    await s.close()


async def test_large_drain_is_cut_into_files_of_max_records(tmp_path: Path) -> None:
    """One drain larger than max_records becomes several files of at most max_records each."""
    s = LandingSink(cfg(tmp_path, max_records=10))
    await s.start()
    s.add(fetched("events", 0, 0, 25))
    [res] = await s.publish()
    await s.close()
    assert [(r.first_offset, r.count) for r in res.published] == [(0, 10), (10, 10), (20, 5)]
    assert landed_offsets(tmp_path / "landing", "events", 0) == list(range(25))


async def test_unwritable_landing_keeps_records_and_recovers(tmp_path: Path) -> None:
    """When the landing directory cannot be written, publish reports a retriable error, keeps every
    record buffered, and publishes them all once the directory is writable again."""
    s = LandingSink(cfg(tmp_path))
    await s.start()
    tp = TopicPartition("blocked", 0)
    await resume_position(s, tp)
    blocker = tmp_path / "landing" / "topic=blocked"
    blocker.write_bytes(b"not a folder")  # works as root too, unlike chmod
    s.add(fetched("blocked", 0, 0, 5))
    [r1] = await s.publish()
    assert r1.error is not None and r1.error.retriable and not r1.published
    s.add(fetched("blocked", 0, 5, 5))
    assert s.pending() == {tp: 10}
    blocker.unlink()
    [r2] = await s.publish()
    assert r2.error is None and r2.next_offset == 10
    await s.close()
    assert landed_offsets(tmp_path / "landing", "blocked", 0) == list(range(10))


async def test_unwritable_root_fails_start(tmp_path: Path) -> None:
    """A landing dir that cannot be created is a clear, retriable LandingError at start."""
    (tmp_path / "file").write_bytes(b"")
    s = LandingSink(LandingConfig(dir=tmp_path / "file" / "landing"))
    with pytest.raises(LandingError) as err:
        await s.start()
    assert err.value.retriable and "not writable" in str(err.value)
    await s.close()


def test_completeness_markers(tmp_path: Path) -> None:
    """An hour folder gets _COMPLETE once every partition published past the hour's end or was
    idle past it, and not before; later hours stay unmarked."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    pub.publish("t", 0, pa.Table.from_batches([fetched("t", 0, 0, 3, T0 + 10).records]), None)
    pub.publish("t", 0, pa.Table.from_batches([fetched("t", 0, 3, 3, T0 + HOUR + 10).records]), 2)
    pub.publish("t", 1, pa.Table.from_batches([fetched("t", 1, 0, 3, T0 + 20).records]), None)
    h0 = root / "topic=t/dt=2026-01-01/hour=00"
    assert update_markers(root, "t", 2) == []  # partition 1 is not past hour 00
    pub.store.advance_watermark("t", 1, T0 + HOUR + 1)  # partition 1 was seen idle after 01:00
    assert read_watermarks(root, "t", 2) == [T0 + HOUR + 10, T0 + HOUR + 1]
    assert update_markers(root, "t", 2) == [h0 / "_COMPLETE"]
    body = json.loads((h0 / "_COMPLETE").read_bytes())
    assert (body["topic"], body["dt"], body["hour"], body["partitions"]) == ("t", "2026-01-01", "00", 2)
    assert not (root / "topic=t/dt=2026-01-01/hour=01/_COMPLETE").exists()
    assert update_markers(root, "t", 2) == []  # idempotent
    assert update_markers(root, "t", 3) == []  # a partition never seen blocks completeness


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=5 * HOUR), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=7),
)
def test_hour_runs_partition_the_records(ts: list[int], chunk: int) -> None:
    """hour_runs covers every row exactly once, in order, each run within one hour and adjacent
    runs in different hours, whatever the chunking of the table."""
    arr = np.array(ts, dtype=np.int64) + T0
    batches = [
        fetched("t", 0, i, len(arr[i : i + chunk]), arr[i : i + chunk]).records
        for i in range(0, len(arr), chunk)
    ]
    table = layout.concat(batches)
    runs = layout.hour_runs(table)
    assert sum(n for _, _, n in runs) == len(arr)
    pos = 0
    for i, (hour, start, n) in enumerate(runs):
        assert start == pos and n > 0
        assert set((arr[start : start + n] // HOUR).tolist()) == {hour}
        if i:
            assert runs[i - 1][0] != hour
        pos += n


def test_foreign_file_is_corrupt_not_ours(tmp_path: Path) -> None:
    """read_ranges refuses a file mqd did not write, with a clear error."""
    p = tmp_path / "x.parquet"
    p.write_bytes(b"PAR1garbage")
    with pytest.raises(LandingCorrupt):
        layout.read_ranges(p)
    pq.write_table(pa.table({"a": [1]}), p)
    with pytest.raises(LandingCorrupt, match="not an mqd landing file"):
        layout.read_ranges(p)
    assert os.path.exists(p)


async def test_absurd_timestamps_are_filed_not_fatal(tmp_path: Path) -> None:
    """Records stamped before 1970 or after 9999 land (under the nearest end of the folder range)
    with their timestamps intact, instead of failing the publication."""
    s = LandingSink(cfg(tmp_path))
    await s.start()
    ts = np.array([-(2**60), 2**60, T0], dtype=np.int64)
    s.add(fetched("events", 0, 0, 3, ts))
    [res] = await s.publish()
    await s.close()
    assert res.error is None and res.next_offset == 3
    folders = sorted(r.path.rsplit("/", 1)[0] for r in res.published)
    assert folders == [
        "topic=events/dt=1970-01-01/hour=00",
        "topic=events/dt=2026-01-01/hour=00",
        "topic=events/dt=9999-12-31/hour=23",
    ]
    assert landed_offsets(tmp_path / "landing", "events", 0) == [0, 1, 2]


async def test_stale_temp_files_are_removed_at_start(tmp_path: Path) -> None:
    """Temp files a killed writer left behind (next to an object, or a half-encoded scratch file)
    are deleted at start once they are old; fresh ones (a live publisher elsewhere) are kept."""
    LocalStore(tmp_path / "landing").open()
    hour = tmp_path / "landing/topic=events/dt=2026-01-01/hour=00"
    scratch = tmp_path / "landing/_staging/.scratch/mqd-stage-x"
    hour.mkdir(parents=True)
    scratch.mkdir(parents=True)
    old, fresh = hour / ".part-00000-x.parquet.ab.tmp", hour / ".part-00001-x.parquet.cd.tmp"
    old_scratch = scratch / "staged.parquet"
    for f in (old, fresh, old_scratch):
        f.write_bytes(b"partial")
    os.utime(old, (0, 0))
    os.utime(old_scratch, (0, 0))
    s = LandingSink(cfg(tmp_path))
    await s.start()
    await s.close()
    assert not old.exists() and not old_scratch.exists() and fresh.exists()


async def test_age_counts_from_fetch_time(tmp_path: Path) -> None:
    """A buffer's age starts when its first record was fetched, not when it was drained into the
    sink, so records that waited in the consumer do not get a fresh max_age."""
    s = LandingSink(cfg(tmp_path, max_age=1.0))
    tp = TopicPartition("events", 0)
    s.add(dataclasses.replace(fetched("events", 0, 0, 3), fetched_at=100.0))
    s.add(dataclasses.replace(fetched("events", 0, 3, 3), fetched_at=100.8))  # joins: age unchanged
    assert s.next_due_in(now=100.5) == pytest.approx(0.5)
    assert s.due(now=100.99) == []
    assert s.due(now=101.0) == [tp]
    await s.close()


async def test_publish_lead_moves_the_age_cut_earlier(tmp_path: Path) -> None:
    """After publications were measured, an age cut happens that much before max_age (so the file
    is visible by max_age), and never earlier than half of max_age."""
    s = LandingSink(cfg(tmp_path, max_age=1.0))
    await s.start()
    tp = TopicPartition("events", 0)
    assert s.publish_lead == 0.0
    s.add(fetched("events", 0, 0, 5))
    await s.publish()
    lead = s.publish_lead
    assert 0.0 < lead <= 0.5
    s.add(fetched("events", 0, 5, 5), now=200.0)
    assert s.due(now=200.0 + 1.0 - lead - 0.001) == []
    assert s.due(now=200.0 + 1.0 - lead + 1e-6) == [tp]
    assert s.next_due_in(now=200.0) == pytest.approx(1.0 - lead)
    for _ in range(10):
        s.batches.observe_publish(30.0)  # a stalled disk
    assert s.publish_lead == pytest.approx(0.5)
    await s.close()


def hold(pool: ThreadPoolExecutor) -> threading.Event:
    """Occupy the one-thread ``pool`` until the returned event is set: publications queue behind
    it, which keeps them in flight for as long as a test needs."""
    gate = threading.Event()
    pool.submit(gate.wait, 10)
    return gate


async def test_busy_partition_is_skipped_and_its_publications_stay_ordered(tmp_path: Path) -> None:
    """From publish_partition() on, a partition is busy: due()/next_due_in() skip it. A second
    publication of it waits for the first and publishes what was added meanwhile, after it, in
    offset order."""
    pool = ThreadPoolExecutor(1)
    s = LandingSink(cfg(tmp_path, max_age=1.0), executor=pool)
    await s.start()
    tp = TopicPartition("events", 0)
    await resume_position(s, tp)
    gate = hold(pool)
    s.add(fetched("events", 0, 0, 10), now=100.0)
    first = s.publish_partition(tp)
    assert s.busy(tp) and s.due(now=1000.0) == [] and s.next_due_in(now=1000.0) is None
    t1 = asyncio.create_task(first)
    await wait_until(lambda: s.inflight_bytes > 0, 5.0, "first publication in flight", interval=0.005)
    s.add(fetched("events", 0, 10, 5), now=100.0)
    assert s.due(now=1000.0) == []  # still busy: the next cut waits
    t2 = asyncio.create_task(s.publish_partition(tp))
    gate.set()
    r1, r2 = await asyncio.wait_for(asyncio.gather(t1, t2), 10)
    assert r1 is not None and r2 is not None
    assert [(r.first_offset, r.last_offset) for r in r1.published + r2.published] == [(0, 9), (10, 14)]
    assert not s.busy(tp) and s.expected(tp) == 14 and s.inflight_bytes == 0
    await s.close()
    pool.shutdown()
    assert landed_offsets(tmp_path / "landing", "events", 0) == list(range(15))


async def test_revoke_during_publication_keeps_it_but_forgets_the_partition(tmp_path: Path) -> None:
    """A publication in flight when its partition is revoked still completes (it is conditional,
    hence valid), but it neither restores dropped records nor sets the sink's position: the next
    owner reads the position from the landing directory."""
    pool = ThreadPoolExecutor(1)
    s = LandingSink(cfg(tmp_path), executor=pool)
    await s.start()
    tp = TopicPartition("events", 1)
    await resume_position(s, tp)
    gate = hold(pool)
    s.add(fetched("events", 1, 0, 10))
    task = asyncio.create_task(s.publish_partition(tp))
    await wait_until(lambda: s.inflight_bytes > 0, 5.0, "publication in flight", interval=0.005)
    s.add(fetched("events", 1, 10, 5))
    assert s.forget(tp) == 5
    gate.set()
    res = await asyncio.wait_for(task, 10)
    assert res is not None and res.next_offset == 10 and not res.owned
    assert s.expected(tp) is None and s.pending() == {}
    assert await resume_position(s, tp) == 10
    await s.close()
    pool.shutdown()
