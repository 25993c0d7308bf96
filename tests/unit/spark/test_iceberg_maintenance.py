"""Iceberg table maintenance without Spark (mqd/spark/iceberg_maintenance.py): compaction keeps every
row once and bounds the files per partition, expiry deletes only what no kept snapshot needs, and the
sink's exactly-once check still works across both."""

from __future__ import annotations

import math
import time
from pathlib import Path

from support.iceberg_batches import batch, keys
from support.iceberg_readers import every_iceberg_reader_column, every_iceberg_reader_keys

from mqd.spark.iceberg_maintenance import OPERATION_PROPERTY, QUERY_ID_PROPERTY, compact, expire
from mqd.spark.iceberg_sink import IcebergSink

TARGET = 1 << 20


def files_by_partition(sink: IcebergSink) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for task in sink.table.scan().plan_files():
        out.setdefault(repr(task.file.partition), []).append(task.file.file_size_in_bytes)
    return out


def data_files_on_disk(table: Path) -> set[Path]:
    return set((table / "data").rglob("*.parquet"))


def test_compaction_keeps_every_row_once_within_the_file_bound(tmp_path: Path) -> None:
    """Twenty one-batch files in each of two partitions become at most 2 x ceil(bytes / target)
    files per partition; every reader still counts each record once; the compaction snapshot
    carries the newest token, so a re-run batch is still skipped and the next one appended."""
    sink = IcebergSink(tmp_path / "events", partition_by=["topic", "partition"])
    for b in range(20):
        for p in range(2):
            assert sink.write_batch(batch(b * 10, 10, partition=p), "q", b * 2 + p)
    assert all(len(sizes) == 20 for sizes in files_by_partition(sink).values())

    done = compact(sink.table, TARGET)
    assert (done.files_removed, done.partitions_compacted, done.rows) == (40, 2, 400)
    for sizes in files_by_partition(sink).values():
        assert len(sizes) <= 2 * math.ceil(sum(sizes) / TARGET)
    expected = sorted(keys(0, 200) + keys(0, 200, partition=1))
    for reader, got in every_iceberg_reader_keys(tmp_path / "events").items():
        assert got == expected, reader
    summary = sink.table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary[OPERATION_PROPERTY] == "compaction"
    assert summary[QUERY_ID_PROPERTY] == "q" and sink.committed_batch("q") == 39
    assert not sink.write_batch(batch(190, 10, partition=1), "q", 39)
    assert sink.write_batch(batch(200, 10), "q", 40)
    again = compact(sink.table, TARGET)  # the compacted file is still small: the new one joins it
    assert (again.files_removed, again.files_added, again.rows) == (2, 1, 210)
    assert compact(sink.table, TARGET).files_removed == 0  # one small file per partition: left alone


def test_a_column_added_later_reads_null_in_compacted_rows(tmp_path: Path) -> None:
    """Files written before a column existed are compacted with it as null; the values written with
    it are kept."""
    sink = IcebergSink(tmp_path / "events", partition_by=["topic"])
    assert sink.write_batch(batch(0, 5), "q", 0)
    assert sink.write_batch(batch(5, 5, country=["se"] * 5), "q", 1)
    assert compact(sink.table, TARGET).rows == 10
    for reader, rows in every_iceberg_reader_column(tmp_path / "events", "country").items():
        assert [r[2] for r in rows] == [None] * 5 + ["se"] * 5, reader


def test_expiry_deletes_only_the_files_no_kept_snapshot_needs(tmp_path: Path) -> None:
    """After compaction, expiring every snapshot but the current one deletes the replaced data
    files, and no file the current snapshot reads; a retention that keeps them deletes nothing."""
    table_dir = tmp_path / "events"
    sink = IcebergSink(table_dir, partition_by=["topic"])
    for b in range(6):
        assert sink.write_batch(batch(b * 10, 10), "q", b)
    compact(sink.table, TARGET)
    before = data_files_on_disk(table_dir)
    assert len(before) == 7

    assert expire(sink.table, retention_s=3600).snapshots_expired == 0
    assert data_files_on_disk(table_dir) == before

    result = expire(sink.table, retention_s=0, now=time.time() + 1)
    assert result.snapshots_expired == 6 and len(sink.table.snapshots()) == 1
    live = {Path(t.file.file_path.removeprefix("file:")) for t in sink.table.scan().plan_files()}
    assert data_files_on_disk(table_dir) == live and len(live) == 1
    for reader, got in every_iceberg_reader_keys(table_dir).items():
        assert got == keys(0, 60), reader
    assert sink.committed_batch("q") == 5 and not sink.write_batch(batch(50, 10), "q", 5)


def test_describe_reads_the_current_snapshot(tmp_path: Path) -> None:
    """Files, rows and the partition spec come from the current snapshot's summary, after appends
    and after a compaction (which names itself as the last operation)."""
    from mqd.spark.iceberg_maintenance import describe

    sink = IcebergSink(tmp_path / "events", partition_by=["topic"])
    for b in range(3):
        assert sink.write_batch(batch(b * 10, 10), "q", b)
    info = describe(sink.table)
    assert (info.files, info.rows, info.partition_columns, info.last_operation) == (
        3,
        30,
        ["topic (identity)"],
        "append",
    )
    compact(sink.table, TARGET)
    info = describe(sink.table)
    assert (info.files, info.rows, info.last_operation) == (1, 30, "compaction")
    assert info.bytes == sum(t.file.file_size_in_bytes for t in sink.table.scan().plan_files())
