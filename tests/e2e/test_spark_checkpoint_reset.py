"""A checkpoint deleted (or an older copy restored) while its table is kept (issue 31, item 1): the
job refuses to start (exit 2) and names the recovery, for every table format, instead of appending
every landed record again (Delta, Iceberg: duplicates) or taking the table's batches as its own and
letting the landing's cleaner delete files that never reached the table (parquet: loss)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from support.delta import land, make_config

from mqd.landing import lifecycle
from mqd.landing.backends import open_store
from mqd.landing.store import LandingStore
from mqd.spark import job
from mqd.spark.checkpoint_guard import TableWriter, delta_writer, problem

pytestmark = pytest.mark.spark

FORMATS = ["delta", "iceberg", "parquet"]


def _rows(spark: Any, fmt: str, out: Path) -> int:
    if fmt == "iceberg":
        from pyiceberg.table import StaticTable

        return int(StaticTable.from_metadata(str(out)).scan().to_arrow().num_rows)
    return int(spark.read.format(fmt).load(str(out)).count())


def _refused(cfg: Any) -> str:
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 2
    [event] = [e for e in logs if e["event"] == "spark_checkpoint_mismatch"]
    return str(event["error"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_deleted_checkpoint_is_refused(tmp_path: Path, spark: Any, fmt: str) -> None:
    """Run, delete the checkpoint, land more, run: exit 2 naming the table, the new checkpoint and
    the recovery; the table keeps exactly what it had and the lifecycle record is unchanged."""
    cfg = make_config(tmp_path, table_format=fmt)
    land(Path(cfg.landing.dir), partitions=2, files=2, records=25)
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    assert _rows(spark, fmt, out) == 100
    store = open_store(str(cfg.landing.dir))
    assert isinstance(store, LandingStore)  # a path landing is the object store on local objects
    before = lifecycle.records(store)
    assert before  # the first run recorded what it committed

    shutil.rmtree(cfg.spark.checkpoint_dir)
    land(Path(cfg.landing.dir), partitions=1, files=1, records=25, first_file=2)
    msg = _refused(cfg)
    assert str(out) in msg and "is new" in msg and "restore the checkpoint" in msg
    assert _rows(spark, fmt, out) == 100
    assert lifecycle.records(store) == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_older_checkpoint_copy_is_refused(tmp_path: Path, spark: Any, fmt: str) -> None:
    """A checkpoint copied after the first run and put back after two more: the table is batches
    ahead of it, and the job refuses rather than plan those batches anew."""
    cfg = make_config(tmp_path, table_format=fmt, max_files_per_trigger=1)
    ckpt = Path(cfg.spark.checkpoint_dir)
    land(Path(cfg.landing.dir), partitions=1, files=1, records=10)
    assert job.run(cfg, once=True) == 0
    shutil.copytree(ckpt, tmp_path / "ckpt-copy")
    land(Path(cfg.landing.dir), partitions=1, files=3, records=10, first_file=1)
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    assert _rows(spark, fmt, out) == 40
    shutil.rmtree(ckpt)
    shutil.copytree(tmp_path / "ckpt-copy", ckpt)
    land(Path(cfg.landing.dir), partitions=1, files=1, records=10, first_file=4)
    msg = _refused(cfg)
    assert "older copy" in msg or "is new" in msg, msg
    assert _rows(spark, fmt, out) == 40


def test_a_restart_with_its_own_checkpoint_goes_on(tmp_path: Path, spark: Any) -> None:
    """The guard refuses nothing that is right: the same checkpoint, run after run, adds each new
    record once."""
    cfg = make_config(tmp_path)
    land(Path(cfg.landing.dir), partitions=1, files=1, records=10)
    assert job.run(cfg, once=True) == 0
    land(Path(cfg.landing.dir), partitions=1, files=1, records=10, first_file=1)
    assert job.run(cfg, once=True) == 0
    assert job.run(cfg, once=True) == 0
    assert _rows(spark, "delta", Path(cfg.spark.output_dir)) == 20


def test_the_rule_on_each_shape_of_mismatch(tmp_path: Path) -> None:
    """Pure rule: no writer, or one batch ahead (the commit the checkpoint did not record yet), is
    fine; another query, a new checkpoint, or two batches ahead is refused."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "commits").mkdir(parents=True)
    (ckpt / "metadata").write_text('{"id":"q-1"}')
    for b in range(3):
        (ckpt / "commits" / str(b)).write_text("v1\n{}")
    assert problem("t", ckpt, None) is None
    assert problem("t", ckpt, TableWriter("q-1", 3)) is None
    assert problem("t", ckpt, TableWriter("q-1", 2)) is None
    assert "older copy" in (problem("t", ckpt, TableWriter("q-1", 4)) or "")
    assert "not by the checkpoint's query q-1" in (problem("t", ckpt, TableWriter("q-2", 1)) or "")
    assert "is new" in (problem("t", tmp_path / "none", TableWriter(None, 0)) or "")
    history = [
        {"operation": "OPTIMIZE", "operationParameters": {}},
        {"operation": "STREAMING UPDATE", "operationParameters": {"queryId": "q-1", "epochId": "7"}},
    ]
    assert delta_writer(history) == TableWriter("q-1", 7)


def test_the_delta_log_read_directly_names_the_writer_spark_names(tmp_path: Path, spark: Any) -> None:
    """The guard reads a table's newest streaming commit from `_delta_log` itself (no JVM): the
    same query id and batch as Delta's own history, also after a compaction commit on top."""
    from delta.tables import DeltaTable

    from mqd.spark.checkpoint_guard import delta_log_history
    from mqd.spark.table_maintenance import optimize

    cfg = make_config(tmp_path, max_files_per_trigger=1)
    land(Path(cfg.landing.dir), partitions=1, files=3, records=10)
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    optimize(spark, out, 1 << 20)

    def by_spark() -> TableWriter | None:
        rows = DeltaTable.forPath(spark, str(out)).history(100).collect()
        return delta_writer([r.asDict(recursive=True) for r in rows])

    direct = delta_writer(delta_log_history(out))
    assert direct is not None and direct == by_spark() and direct.batch == 2
    assert delta_log_history(out)[0]["operation"] == "OPTIMIZE"
    assert delta_writer(delta_log_history(tmp_path / "no-table")) is None
