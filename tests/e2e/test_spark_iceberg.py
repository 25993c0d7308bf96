"""The Iceberg output (mqd/spark/iceberg_sink.py) behind a real streaming query over a real landing:
Spark's ``foreachBatch`` hands each micro-batch to pyiceberg in the driver, and pyiceberg, DuckDB
and Polars, given only the table's folder, count each landed record once, also when Spark re-runs a
batch after a crash on either side of the Iceberg commit.

The query is built here the way mqd.spark.job builds the raw one (its ``_source``, foreign rows left
out, ``output_columns``), so the sink is proven before the job writes through it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import CommitTableResponse, StaticTable, Table
from pyiceberg.table.update import TableRequirement, TableUpdate
from support.delta import Offsets, land, make_config
from support.iceberg_readers import every_iceberg_reader_column, every_iceberg_reader_keys
from support.table_readers import offsets

from mqd.config import MqdConfig
from mqd.spark import job
from mqd.spark.iceberg_catalog import FolderCatalog
from mqd.spark.iceberg_sink import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, IcebergSink, foreach_batch

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180  # one availableNow run over a few small files takes seconds


class FailingCatalog(FolderCatalog):
    """The folder catalog whose ``fail_commit``-th commit (1 = the one that creates the table)
    raises instead of landing, as if the driver died after writing the batch's data files."""

    def __init__(self, location: str, fail_commit: int | None) -> None:
        super().__init__(location)
        self.commits = 0
        self.fail_commit = fail_commit

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        self.commits += 1
        if self.commits == self.fail_commit:
            raise RuntimeError("the driver died before the commit")
        return super().commit_table(table, requirements, updates)


class RecordingSink(IcebergSink):
    """The sink at ``spark.output_dir``, recording each (query id, batch id, appended?) Spark hands
    it; ``fail_commit``: see FailingCatalog."""

    def __init__(self, cfg: MqdConfig, fail_commit: int | None = None) -> None:
        out = str(cfg.spark.output_dir)
        super().__init__(
            out,
            partition_by=cfg.spark.partition_by,
            catalog=FailingCatalog(out, fail_commit),
            query_name=job.query_name(cfg),
        )
        self.calls: list[tuple[str, int, bool]] = []

    def write_batch(self, batch: pa.Table, query_id: str, batch_id: int) -> bool:
        appended = super().write_batch(batch, query_id, batch_id)
        self.calls.append((query_id, batch_id, appended))
        return appended


def run_query(spark: Any, cfg: MqdConfig, sink: IcebergSink, extra: Sequence[Any] = ()) -> str:
    """One ``--once``-style run (availableNow) of the raw query into ``sink``, from the
    checkpoint in ``spark.checkpoint_dir``; returns the query's id. A failed batch raises."""
    from pyspark.sql import functions as F

    df = job._source(spark, cfg)
    foreign = F.col("partition").isNull() | F.col("offset").isNull()
    query = (
        df.where(~foreign)
        .select(*job.output_columns(), *extra)
        .writeStream.foreachBatch(foreach_batch(sink))
        .queryName(job.query_name(cfg))
        .option("checkpointLocation", str(Path(cfg.spark.checkpoint_dir) / "main"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "the query did not finish in time"
    finally:
        if query.isActive:
            query.stop()
    return str(query.id)


def assert_exact(table: Path, expected: Offsets) -> None:
    """pyiceberg, DuckDB and Polars each see every expected record once."""
    for reader, keys in every_iceberg_reader_keys(table).items():
        assert offsets(keys) == expected, reader
        assert len(set(keys)) == len(keys), reader


def tokens(table: Path) -> list[tuple[str | None, int]]:
    """(query id, batch id) of each snapshot, oldest first."""
    snapshots = StaticTable.from_metadata(str(table)).snapshots()
    return [
        (s.summary[QUERY_ID_PROPERTY], int(s.summary[BATCH_ID_PROPERTY] or -1))
        for s in snapshots
        if s.summary is not None
    ]


def test_every_reader_counts_each_record_once(tmp_path: Path, spark: Any) -> None:
    """N landed records -> a streaming run into the sink -> an Iceberg table (format 2, identity
    partitions topic/dt, no _spark_metadata) in which pyiceberg, DuckDB and Polars each see exactly
    the N keys; each batch is one snapshot carrying the query's id and the batch id. A second run
    from the same checkpoint (a restart: the same query id) appends only the newly landed records."""
    cfg = make_config(tmp_path)
    out = Path(cfg.spark.output_dir)
    expected = land(Path(cfg.landing.dir), partitions=3, files=3, records=40)
    sink = RecordingSink(cfg)
    query_id = run_query(spark, cfg, sink)
    assert_exact(out, expected)
    assert [(q, b) for q, b, _ in sink.calls] == [(query_id, b) for b in range(3)]  # 9 files, 4 a batch
    assert tokens(out) == [(query_id, b) for b in range(3)]
    table = StaticTable.from_metadata(str(out))
    assert table.format_version == 2 and [f.name for f in table.spec().fields] == ["topic", "dt"]
    assert not (out / "_spark_metadata").exists()

    expected = sorted(expected + land(Path(cfg.landing.dir), partitions=1, files=2, records=40, first_file=3))
    again = RecordingSink(cfg)
    assert run_query(spark, cfg, again) == query_id
    assert [(q, b, a) for q, b, a in again.calls] == [(query_id, 3, True)]
    assert_exact(out, expected)


def _last_commit(checkpoint: Path) -> Path:
    commits = [p for p in (checkpoint / "main" / "commits").iterdir() if p.name.isdigit()]
    return max(commits, key=lambda p: int(p.name))


def test_a_batch_rerun_after_its_iceberg_commit_is_skipped(tmp_path: Path, spark: Any) -> None:
    """A crash between the Iceberg commit and Spark's checkpoint commit (the batch's entry in the
    checkpoint's commits/ removed): the restarted query re-runs that batch with the same query id
    and batch id, the sink finds it in the table and skips it, and no reader sees a record twice."""
    cfg = make_config(tmp_path)
    out = Path(cfg.spark.output_dir)
    expected = land(Path(cfg.landing.dir), partitions=2, files=3, records=30)
    query_id = run_query(spark, cfg, RecordingSink(cfg))
    before = tokens(out)
    last = _last_commit(Path(cfg.spark.checkpoint_dir))
    last.unlink()
    last.with_name(f".{last.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of it

    again = RecordingSink(cfg)
    assert run_query(spark, cfg, again) == query_id
    assert again.calls == [(query_id, int(last.name), False)]
    assert tokens(out) == before
    assert_exact(out, expected)


def test_a_batch_whose_commit_never_landed_is_written_whole_on_restart(tmp_path: Path, spark: Any) -> None:
    """The driver dies after writing a batch's data files, before its Iceberg commit: the query
    fails, the readers see only the batches before (the written files are in no snapshot), and the
    restarted query writes that batch once."""
    cfg = make_config(tmp_path)
    out = Path(cfg.spark.output_dir)
    expected = land(Path(cfg.landing.dir), partitions=3, files=3, records=20)
    failing = RecordingSink(cfg, fail_commit=3)  # 1: the table, 2: batch 0, 3: batch 1
    with pytest.raises(Exception, match="the driver died before the commit"):
        run_query(spark, cfg, failing)
    committed = every_iceberg_reader_keys(out)
    first = committed["pyiceberg"]
    assert 0 < len(first) < len(expected)
    for reader, keys in committed.items():
        assert keys == first, reader
    written = {str(p) for p in (out / "data").rglob("*.parquet")}
    in_table = set(StaticTable.from_metadata(str(out)).inspect.files().column("file_path").to_pylist())
    assert written - in_table, "the failed batch's data files should be on disk, in no snapshot"

    again = RecordingSink(cfg)
    query_id = run_query(spark, cfg, again)
    assert [(b, a) for _q, b, a in again.calls] == [(1, True), (2, True)]
    assert tokens(out) == [(query_id, b) for b in range(3)]
    assert_exact(out, expected)


def test_a_new_column_reads_null_in_the_rows_before(tmp_path: Path, spark: Any) -> None:
    """The query gains a column between two runs of one checkpoint (the landing or the value schema
    grew): the table gains it in the batch that first has it, and every reader sees it null in the
    rows written before, set in the rows after."""
    from pyspark.sql import functions as F

    cfg = make_config(tmp_path)
    out = Path(cfg.spark.output_dir)
    land(Path(cfg.landing.dir), partitions=1, files=1, records=5)
    run_query(spark, cfg, RecordingSink(cfg))
    land(Path(cfg.landing.dir), partitions=1, files=1, records=5, first_file=1)
    note = F.concat(F.lit("n"), F.col("offset").cast("string")).alias("note")
    run_query(spark, cfg, RecordingSink(cfg), extra=[note])

    expected = [(0, o, None) for o in range(5)] + [(0, o, f"n{o}") for o in range(5, 10)]
    for reader, rows in every_iceberg_reader_column(out, "note").items():
        assert rows == expected, reader
    metadata = json.loads(sorted((out / "metadata").glob("v*.metadata.json"), key=_version)[-1].read_text())
    assert metadata["format-version"] == 2


def _version(path: Path) -> int:
    return int(path.name.split(".")[0][1:])


def test_the_job_writes_an_iceberg_table(tmp_path: Path, spark: Any) -> None:
    """`spark.table_format = "iceberg"` through the job itself (`mqd spark --once`'s code): every
    Iceberg reader counts each landed record once, a second run adds only the new ones, and the
    folder is then an Iceberg table that a Delta config refuses to write."""
    from mqd.spark.table_format import existing_format, table_format_problem

    cfg = make_config(tmp_path, table_format="iceberg")
    expected = land(Path(cfg.landing.dir), partitions=2, files=2, records=30)
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    assert existing_format(out) == "iceberg"
    for reader, keys in every_iceberg_reader_keys(out).items():
        assert offsets(keys) == expected, reader
    expected = sorted(expected + land(Path(cfg.landing.dir), partitions=1, files=1, records=30, first_file=2))
    assert job.run(cfg, once=True) == 0
    for reader, keys in every_iceberg_reader_keys(out).items():
        assert offsets(keys) == expected, reader
        assert len(set(keys)) == len(keys), reader
    problem = table_format_problem(make_config(tmp_path))
    assert problem is not None and "'iceberg'" in problem


def test_the_job_compacts_its_iceberg_table_between_batches(tmp_path: Path, spark: Any) -> None:
    """With a short maintenance interval the job compacts between its own batches (the table's one
    writer): a run of many small batches ends with at most 2 x ceil(bytes / target) files per table
    partition, every record once for every reader, and a re-run adds nothing."""
    import structlog

    cfg = make_config(
        tmp_path,
        table_format="iceberg",
        max_files_per_trigger=2,
        maintenance_interval=0.001,
        target_file_size="1MiB",
    )
    expected = land(Path(cfg.landing.dir), partitions=2, files=8, records=25)
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 0
    assert any(e["event"] == "table_maintained" and e["files_removed"] > 0 for e in logs), logs
    out = Path(cfg.spark.output_dir)
    table = StaticTable.from_metadata(str(out))
    sizes: dict[str, list[int]] = {}
    for task in table.scan().plan_files():
        sizes.setdefault(repr(task.file.partition), []).append(task.file.file_size_in_bytes)
    assert sizes and all(len(s) <= 2 * -(-sum(s) // (1 << 20)) for s in sizes.values()), sizes
    for reader, keys in every_iceberg_reader_keys(out).items():
        assert offsets(keys) == expected, reader
    assert job.run(cfg, once=True) == 0
    for reader, keys in every_iceberg_reader_keys(out).items():
        assert offsets(keys) == expected, reader
