"""The streaming stage (issue 16): a landing file written a row group at a time into its open staged
file, on both stores, reads exactly like one written whole; the sink keeps a partition's file open
across cuts, so memory pressure and row-group cuts no longer decide file sizes; an error that loses
an open file's earlier row groups makes the partition be fetched again from the file's first offset
(never a gap)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.seaweedfs import object_store
from support.streamed_files import records, stream_three_row_groups

from mqd.config import LandingConfig
from mqd.landing import layout
from mqd.landing.errors import LandingError
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher, file_range
from mqd.landing.s3_objects import PART_BYTES, S3Objects
from mqd.landing.sink import LandingSink
from mqd.testing.seaweedfs import SeaweedFS
from mqd.waiting import wait_until


class Batch:
    """A drained batch as the sink sees it (micro_batches.Drained)."""

    def __init__(self, first: int, count: int, size: int = 10) -> None:
        self.tp = ("t", 0)
        self.records = records(first, count, size).to_batches()[0]
        self.first_offset = first
        self.next_offset = first + count
        self.nbytes = self.records.nbytes
        self.fetched_at = time.monotonic()
        self.incarnation: str | None = None


def check_file(path: Path | str, data: bytes | None = None) -> None:
    source = pa.BufferReader(data) if data is not None else str(path)
    pf = pq.ParquetFile(source)
    assert pf.metadata.num_row_groups == 3
    table = pf.read()
    assert table.column("offset").to_pylist() == list(range(3000))
    assert table.schema.field("topic").type == pa.dictionary(pa.int32(), pa.string())
    meta = table.schema.metadata
    assert meta[layout.META_VERSION] == str(layout.SCHEMA_VERSION).encode()
    [rng] = [layout.FileRange.from_json(d) for d in json.loads(meta[layout.META_RANGES])]
    assert (rng.first_offset, rng.last_offset, rng.count) == (0, 2999, 3000)


def test_a_file_streamed_in_row_groups_reads_like_one_written_whole(tmp_path: Path) -> None:
    """Local store: three writes make one visible file of three row groups whose Arrow schema
    carries the range metadata (layout.read_ranges reads it) and the dictionary columns; no
    scratch file is left behind."""
    store = LocalStore(tmp_path)
    store.open()
    rng = stream_three_row_groups(store)
    check_file(tmp_path / rng.path)
    assert layout.read_ranges(tmp_path / rng.path)[0].count == 3000
    assert store.manifest("t") == [rng]
    assert not [p for p in (tmp_path / "_staging").rglob("*") if p.is_file()]


def test_an_aborted_stage_leaves_nothing(tmp_path: Path) -> None:
    """abort() forgets the scratch file; nothing is visible or staged."""
    store = LocalStore(tmp_path)
    store.open()
    part = records(0, 10)
    writer = store.open_stage(file_range("t", 0, part), "snappy")
    writer.write(layout.landing_table("t", 0, part))
    writer.abort()
    writer.abort()  # idempotent
    assert not [p for p in (tmp_path / "_staging").rglob("*") if p.is_file()]
    assert store.visible_files() == []


def test_s3_streams_a_large_file_as_a_multipart_upload(seaweedfs: SeaweedFS) -> None:
    """S3: a staged file larger than one part goes up as a multipart upload written as it fills,
    commits and reads back whole; a small one is one PUT; an aborted one leaves no object."""
    store = object_store(seaweedfs)
    size = PART_BYTES // 1000  # 3 row groups of ~1 part each (random bytes do not compress)
    rng = stream_three_row_groups(store, size=size)
    assert rng.bytes > 2 * PART_BYTES
    got = store.objects.get(rng.path)
    assert got is not None
    check_file(rng.path, got[0])
    small = stream_three_row_groups(object_store(seaweedfs))
    assert small.bytes < PART_BYTES
    part = records(5000, 10)
    writer = store.open_stage(file_range("t", 0, part), "snappy")
    writer.write(
        layout.landing_table("t", 0, pa.Table.from_batches([records(5000, 10, size).to_batches()[0]]))
    )
    writer.abort()
    assert [o.key for o in store.objects.list_objects("_staging/")] == []


def test_publisher_keeps_a_file_open_across_calls_and_commits_it_at_max_bytes(tmp_path: Path) -> None:
    """stream() without finish keeps the file open; the call whose records bring it to max_bytes
    commits it, and the rest opens the next file."""
    store = LocalStore(tmp_path)
    store.open()
    pub = Publisher(store)
    batches = [records(i * 100, 100).to_batches()[0] for i in range(5)]
    cap = sum(b.nbytes for b in batches[:3])
    out = pub.stream("t", 0, batches[:2], None, 10**6, cap, finish=False)
    assert out.published == [] and out.open is not None and out.open.records == 200
    out = pub.stream("t", 0, batches[2:], None, 10**6, cap, open_file=out.open, finish=False)
    [first] = out.published  # cut where the file reaches max_bytes: ~300 records of equal size
    assert first.first_offset == 0 and 295 <= first.last_offset <= 305
    assert out.open is not None and out.open.first_offset == first.last_offset + 1
    out = pub.stream("t", 0, [], first.last_offset, 10**6, cap, open_file=out.open, finish=True)
    assert [(r.first_offset, r.last_offset) for r in out.published] == [(first.last_offset + 1, 499)]
    assert pq.ParquetFile(tmp_path / out.published[0].path).metadata.num_row_groups == 1


def test_an_error_losing_earlier_row_groups_asks_for_a_refetch(tmp_path: Path) -> None:
    """When committing an open file fails after it took records of an earlier call, the outcome
    names the file's first offset to fetch again (nothing remaining, nothing published); when the
    file began in the failing call, its records are handed back instead (as before streaming)."""
    store = LocalStore(tmp_path)
    store.open()
    pub = Publisher(store)
    out = pub.stream("t", 0, records(0, 100).to_batches(), None, finish=False)
    assert out.open is not None

    def broken_commit(*_a: object, **_k: object) -> layout.FileRange:
        raise LandingError("disk on fire", errno=5)

    store.commit = broken_commit  # type: ignore[method-assign]
    failed = pub.stream("t", 0, records(100, 50).to_batches(), None, open_file=out.open, finish=True)
    assert failed.error is not None and failed.refetch == (0, None)
    assert failed.remaining == [] and failed.published == []
    fresh = pub.stream("t", 0, records(0, 100).to_batches(), None, finish=True)
    assert fresh.error is not None and fresh.refetch is None
    assert sum(b.num_rows for b in fresh.remaining) == 100


def test_the_sink_cuts_row_groups_into_one_file_until_max_bytes(tmp_path: Path) -> None:
    """The sink writes each buffer that reaches the row-group size into the partition's open file
    (no file yet), and a memory-pressure cut does the same; the file is committed at max_bytes,
    so files come out near max_bytes instead of buffer-sized; pending_records counts the open
    file (the watermark must not pass it) while pending_bytes (memory) does not."""

    async def run() -> None:
        cfg = LandingConfig(dir=tmp_path, max_bytes=5 * Batch(0, 100).nbytes, max_age=3600.0)
        sink = LandingSink(cfg)
        sink.batches.config = cfg
        await sink.start()
        try:
            offset = 0
            for _ in range(12):
                sink.add(Batch(offset, 100))
                offset += 100
                due = sink.pressure_cut(1)  # memory pressure: the biggest buffer goes to its file
                assert due == [("t", 0)]
                await sink.publish_partition(("t", 0), finish=None)
                assert sink.pending_bytes == 0
            assert sink.stats.files >= 1
            files = store_files(tmp_path)
            assert all(pq.ParquetFile(f).metadata.num_row_groups > 1 for f in files)
            assert sink.pending_records == offset - sink.stats.records > 0
            await sink.publish()  # finish: the open file lands
            assert sink.pending_records == 0 and sink.stats.records == offset
            got = sorted(
                o for f in store_files(tmp_path) for o in pq.read_table(f).column("offset").to_pylist()
            )
            assert got == list(range(offset))
        finally:
            await sink.close()

    asyncio.run(run())


def store_files(root: Path) -> list[Path]:
    return sorted(root.glob("topic=t/*/*/part-*.parquet"))


@pytest.mark.parametrize("revoke_while_busy", [False, True])
def test_a_dropped_partition_aborts_its_open_file(tmp_path: Path, revoke_while_busy: bool) -> None:
    """A revoke (drop) forgets the open file, idle or held by a running publication: nothing of it
    is published and no staged bytes stay behind."""

    async def run() -> None:
        cfg = LandingConfig(dir=tmp_path, max_bytes=10**7, max_age=3600.0)
        sink = LandingSink(cfg)
        await sink.start()
        try:
            sink.add(Batch(0, 100))
            await sink.publish_partition(("t", 0), finish=False)
            assert sink.pending_records == 100
            sink.add(Batch(100, 100))
            if revoke_while_busy:
                task = asyncio.create_task(sink.publish_partition(("t", 0), finish=False))
                await asyncio.sleep(0)
                sink.forget(("t", 0))
                res = await task
                assert res is not None and not res.owned
            else:
                sink.forget(("t", 0))
            await sink.wait_idle()
            assert sink.pending_records == 0 and sink.stats.files == 0
            assert store_files(tmp_path) == []
            await wait_until(  # the abort runs on a landing worker
                lambda: not [p for p in (tmp_path / "_staging").rglob("*") if p.is_file()],
                10.0,
                "the open file's scratch bytes removed",
            )
        finally:
            await sink.close()

    asyncio.run(run())


def test_the_janitor_aborts_stale_multipart_uploads(seaweedfs: SeaweedFS) -> None:
    """An open staged file of a crashed daemon (a multipart upload never completed, which no
    listing shows) is aborted by remove_stale once it is older than the age, not before."""
    store = object_store(seaweedfs)
    objects = store.objects
    assert isinstance(objects, S3Objects)
    upload = objects.open_upload("_staging/t/00000/crashed.parquet")
    upload.write(b"x" * PART_BYTES)  # one part sent: the multipart upload exists
    assert store.remove_stale(older_than_s=3600) == 0
    assert store.remove_stale(older_than_s=0) == 1
    uploads = objects.client.list_multipart_uploads(Bucket=objects.bucket, Prefix=objects._key("_staging/"))
    assert not uploads.get("Uploads")


def test_the_sink_turns_a_lost_open_file_into_a_reseek(tmp_path: Path) -> None:
    """A commit error after the open file took row groups of an earlier publication: the sink
    drops the partition's records (counted) and reports the error with a conflict at the file's
    first offset - 1, so the daemon re-seeks there (never a gap), instead of keeping a buffer that
    no longer holds those records."""

    async def run() -> None:
        sink = LandingSink(LandingConfig(dir=tmp_path, max_age=3600.0))
        await sink.start()
        try:
            sink.add(Batch(0, 100))
            await sink.publish_partition(("t", 0), finish=False)  # row group 1: the file stays open
            sink.add(Batch(100, 50))

            def broken_commit(*_a: object, **_k: object) -> layout.FileRange:
                raise LandingError("disk on fire", errno=5)

            sink.store.commit = broken_commit  # type: ignore[method-assign]
            [res] = await sink.publish()
            assert res.error is not None and res.published == [] and res.owned
            assert res.conflict is not None and res.conflict.last_offset == -1
            assert sink.pending_records == 0 and sink.stats.dropped == 150
            assert store_files(tmp_path) == []
        finally:
            await sink.close()

    asyncio.run(run())


def test_offsets_are_delta_encoded_and_every_reader_reads_them(tmp_path: Path) -> None:
    """A landing file's offsets are DELTA_BINARY_PACKED (a few bytes a page, not 8 a record) and its
    topic and incarnation dictionary-encoded; pyarrow, DuckDB and Polars read the same offsets."""
    import duckdb
    import polars

    store = LocalStore(tmp_path)
    store.open()
    batches = records(0, 3000).to_batches()
    out = Publisher(store).stream("t", 0, batches, None, incarnations=["0123456789abcdef" * 2] * len(batches))
    [rng] = out.published
    path = tmp_path / rng.path
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in encodings["offset"]
    assert "RLE_DICTIONARY" in encodings["topic"] and "RLE_DICTIONARY" in encodings["incarnation"]
    expected = list(range(3000))
    assert pq.read_table(path).column("offset").to_pylist() == expected
    assert [r[0] for r in duckdb.sql(f"SELECT \"offset\" FROM '{path}' ORDER BY 1").fetchall()] == expected
    assert polars.read_parquet(path)["offset"].sort().to_list() == expected
