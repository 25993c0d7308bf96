"""mqd.spark.iceberg_sink without Spark: the exactly-once token, the folder catalog's commits, schema
evolution and the table's settings, on Arrow batches written straight to ``write_batch``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, StaticTable, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from support.iceberg_batches import T0, batch, keys
from support.iceberg_readers import every_iceberg_reader_column, every_iceberg_reader_keys, pyiceberg_keys

from mqd.landing.local_objects import LocalObjects
from mqd.spark.iceberg_catalog import FolderCatalog, IcebergSinkError, is_iceberg_table
from mqd.spark.iceberg_sink import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    IcebergSink,
    streaming_query_id,
    table_schema,
)


def test_a_batch_written_twice_is_in_the_table_once(tmp_path: Path) -> None:
    """The same (query id, batch id) again, as after a crash between the Iceberg commit and Spark's
    checkpoint commit, is skipped (False), and so is an older batch of that query; the next batch
    and another query's batch 0 are appended. Every reader counts each record once."""
    sink = IcebergSink(tmp_path / "events")
    assert sink.write_batch(batch(0, 10), "query-a", 0)
    assert not sink.write_batch(batch(0, 10), "query-a", 0)
    assert sink.write_batch(batch(10, 5), "query-a", 1)
    assert not sink.write_batch(batch(0, 10), "query-a", 0)
    assert not IcebergSink(tmp_path / "events").write_batch(batch(10, 5), "query-a", 1)  # a new process
    assert sink.write_batch(batch(15, 5), "query-b", 0)
    for reader, got in every_iceberg_reader_keys(tmp_path / "events").items():
        assert got == keys(0, 20), reader
    assert sink.committed_batch("query-a") == 1 and sink.committed_batch("query-b") == 0
    summaries = [s.summary for s in sink.table.snapshots()]
    assert [(s[QUERY_ID_PROPERTY], s[BATCH_ID_PROPERTY]) for s in summaries if s is not None] == [
        ("query-a", "0"),
        ("query-a", "1"),
        ("query-b", "0"),
    ]


def test_an_empty_batch_commits_nothing_but_makes_the_table(tmp_path: Path) -> None:
    """A batch without rows (all filtered out) adds no snapshot; the table exists with its schema."""
    sink = IcebergSink(tmp_path / "events")
    assert not sink.write_batch(batch(0, 0), "q", 0)
    assert is_iceberg_table(tmp_path / "events")
    assert sink.table.current_snapshot() is None
    assert "offset" in sink.table.schema().column_names
    assert sink.write_batch(batch(0, 3), "q", 1)
    assert pyiceberg_keys(tmp_path / "events") == keys(0, 3)


def test_the_table_is_format_2_partitioned_with_commit_retries_off(tmp_path: Path) -> None:
    """A new table: Iceberg format version 2, identity partitions on the configured columns, every
    column optional, pyiceberg's commit retries off; its files under data/<col>=<value>/."""
    sink = IcebergSink(tmp_path / "events", partition_by=["topic", "dt"])
    sink.write_batch(batch(0, 4), "q", 0)
    table = StaticTable.from_metadata(str(tmp_path / "events"))
    assert table.format_version == 2
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("topic", "identity"),
        ("dt", "identity"),
    ]
    assert all(not f.required for f in table.schema().fields)
    assert table.properties["commit.retry.num-retries"] == "0"
    assert list((tmp_path / "events" / "data" / "topic=events").glob("dt=2026-01-01/*.parquet"))


def test_an_existing_table_gets_commit_retries_off(tmp_path: Path) -> None:
    """A table made elsewhere with pyiceberg's default retries: the sink turns them off at start."""
    FolderCatalog(str(tmp_path / "events")).create_table(("mqd", "events"), table_schema(batch(0, 1).schema))
    sink = IcebergSink(tmp_path / "events", partition_by=[]).start()
    assert sink.table.properties["commit.retry.num-retries"] == "0"


def test_a_missing_partition_column_is_refused(tmp_path: Path) -> None:
    """Partitioning by a column the data lacks fails the first batch, naming the column; no table."""
    sink = IcebergSink(tmp_path / "events", partition_by=["topic", "hour"])
    with pytest.raises(IcebergSinkError, match="hour"):
        sink.write_batch(batch(0, 3), "q", 0)
    assert not is_iceberg_table(tmp_path / "events")


def test_a_new_column_is_added_and_reads_null_in_older_rows(tmp_path: Path) -> None:
    """A batch with a column the table lacks adds it (same commit as the batch); every reader sees
    it null in the rows written before and its values in the new ones."""
    sink = IcebergSink(tmp_path / "events")
    sink.write_batch(batch(0, 3), "q", 0)
    sink.write_batch(batch(3, 2, note=["x", "y"]), "q", 1)
    assert "note" in sink.table.schema().column_names
    expected = [(0, 0, None), (0, 1, None), (0, 2, None), (0, 3, "x"), (0, 4, "y")]
    for reader, rows in every_iceberg_reader_column(tmp_path / "events", "note").items():
        assert rows == expected, reader
    assert sink.write_batch(batch(5, 1), "q", 2)  # a batch without it again: null there too


def test_zoned_timestamps_are_written_as_utc(tmp_path: Path) -> None:
    """A batch whose timestamps carry another zone (a session not in UTC) is written as the same
    instants in UTC (Iceberg's timestamptz), not refused."""
    sink = IcebergSink(tmp_path / "events")
    assert sink.write_batch(batch(0, 2, tz="Europe/Berlin"), "q", 0)
    got = StaticTable.from_metadata(str(tmp_path / "events")).scan().to_arrow().column("timestamp")
    assert got.type == pa.timestamp("us", "UTC") and got.to_pylist() == [T0, T0]


class _RaceObjects(LocalObjects):
    """LocalObjects that runs ``before_put`` once, just before the first metadata file is created."""

    def __init__(self, root: Path, before_put: Callable[[], object]) -> None:
        super().__init__(root)
        self.before_put: Callable[[], object] | None = before_put

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        if if_absent and self.before_put is not None:
            hook, self.before_put = self.before_put, None
            hook()
        return super().put(key, data, if_absent=if_absent, if_match=if_match)


class _CountingCatalog(FolderCatalog):
    """The folder catalog, counting the commits it is asked for."""

    attempts = 0

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        self.attempts += 1
        return super().commit_table(table, requirements, updates)


def test_of_two_writers_of_one_version_one_wins_and_the_other_writes_nothing(tmp_path: Path) -> None:
    """Two writers take the same version: the one that creates v<N+1> first wins; the other's
    create-only write fails and pyiceberg raises CommitFailedException at once (commit retries are
    off: one attempt, no second append). The table holds the winner's rows once; the loser's data
    file is left an orphan, in no snapshot, so no reader sees it."""
    location = tmp_path / "events"
    IcebergSink(location).write_batch(batch(0, 2), "q", 0)
    winner = IcebergSink(location)
    race = _RaceObjects(location, lambda: winner.write_batch(batch(2, 3), "q", 1))
    loser_catalog = _CountingCatalog(str(location), race)
    loser = loser_catalog.load_table(("mqd", "events"))
    with pytest.raises(CommitFailedException, match="another writer"):
        loser.append(batch(100, 7))
    assert loser_catalog.attempts == 1
    for reader, got in every_iceberg_reader_keys(location).items():
        assert got == keys(0, 5), reader
    files = loser_catalog.load_table(("mqd", "events")).inspect.files().column("file_path").to_pylist()
    orphans = {str(p) for p in (location / "data").rglob("*.parquet")} - set(files)
    assert len(orphans) == 1


def test_a_lagging_version_hint_is_looked_past_and_repaired(tmp_path: Path) -> None:
    """A writer that died between its commit and the hint leaves the hint a version behind: the
    sink finds the newest version anyway (no batch is lost or written twice) and rewrites the hint
    at start, so readers that trust it (DuckDB, StaticTable) see the whole table."""
    location = tmp_path / "events"
    sink = IcebergSink(location)
    sink.write_batch(batch(0, 2), "q", 0)
    sink.write_batch(batch(2, 2), "q", 1)
    hint = location / "metadata" / "version-hint.text"
    newest = hint.read_text()
    hint.write_text(str(int(newest) - 1))
    assert pyiceberg_keys(location) == keys(0, 2)  # what a hint-trusting reader sees meanwhile

    again = IcebergSink(location).start()
    assert hint.read_text() == newest
    assert not again.write_batch(batch(2, 2), "q", 1)
    for reader, got in every_iceberg_reader_keys(location).items():
        assert got == keys(0, 4), reader


def test_a_catalog_by_properties(tmp_path: Path) -> None:
    """A catalog given as pyiceberg properties (here the SQL catalog on SQLite, what a JDBC catalog
    is in pyiceberg) holds the table instead of the folder: the same exactly-once appends."""
    pytest.importorskip("sqlalchemy")
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}", "warehouse": str(tmp_path)}
    sink = IcebergSink(tmp_path / "events", catalog=props, table_name="events")
    assert sink.write_batch(batch(0, 3), "q", 0)
    assert not IcebergSink(tmp_path / "events", catalog=props, table_name="events").write_batch(
        batch(0, 3), "q", 0
    )
    table = sink.catalog.load_table(("mqd", "events"))
    assert table.location() == str(tmp_path / "events")
    assert table.properties["commit.retry.num-retries"] == "0"
    assert not (tmp_path / "events" / "metadata" / "version-hint.text").exists()
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == [0, 1, 2]


def test_a_location_it_cannot_write_is_refused(tmp_path: Path) -> None:
    """A local folder and s3:// are wired (tests/e2e/test_spark_iceberg_s3.py); another scheme fails
    with a message naming the location, not a traceback deep in pyiceberg."""
    with pytest.raises(IcebergSinkError, match="gs://bucket/events"):
        IcebergSink("gs://bucket/events").start()


class _NoStream:
    """A DataFrame outside a streaming batch: its SparkContext has no streaming query id."""

    class sparkSession:
        class sparkContext:
            @staticmethod
            def getLocalProperty(key: str) -> str | None:
                return None


def test_the_query_id_comes_only_from_a_streaming_batch() -> None:
    """foreach_batch's function called on a DataFrame that no streaming query runs fails with a
    message, writing nothing, rather than appending under a made-up id."""
    with pytest.raises(IcebergSinkError, match="foreachBatch"):
        streaming_query_id(_NoStream())
