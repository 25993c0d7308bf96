"""Delta table maintenance (mqd/spark/table_maintenance.py): compaction and vacuum by the running
job, beside its streaming append, lose and double nothing; `mqd table` refuses while the job runs;
an old parquet table converts to Delta from what its _spark_metadata lists, not from the folder."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cli import mqd
from support.delta import assert_exact, land, make_config
from support.spark_job import start_streaming, stop_streaming
from support.table_readers import every_reader_keys, offsets

from mqd.spark import job
from mqd.spark.table_format import existing_format
from mqd.spark.table_maintenance import LAST_RUN_NAME, MaintenanceSchedule, TableBusy, job_lock
from mqd.waiting import wait_until_sync

pytestmark = pytest.mark.spark


def active_files_by_partition(table: Path) -> dict[str, tuple[int, int]]:
    """Table partition -> (files, bytes) in the table's current version (delta-rs)."""
    from deltalake import DeltaTable

    adds = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pydict()
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path, size in zip(adds["path"], adds["size_bytes"], strict=True):
        key = str(Path(path).parent)
        found[key][0] += 1
        found[key][1] += size
    return {k: (v[0], v[1]) for k, v in found.items()}


def test_compaction_beside_a_streaming_append_is_exact(tmp_path: Path, spark: Any) -> None:
    """The job streams while more files land; its maintenance thread compacts the table between
    batches (an interval of 1 s): every reader counts each record once at the end, and each table
    partition holds at most 2 x ceil(its bytes / target size) files."""
    cfg = make_config(
        tmp_path,
        trigger_interval="1s",
        maintenance_interval=1.0,
        target_file_size=1024 * 1024,
        max_files_per_trigger=2,
        vacuum_retention=3600.0,
    )
    root = Path(cfg.landing.dir)
    expected = land(root, partitions=2, files=3, records=200)
    stamp = Path(cfg.spark.checkpoint_dir) / LAST_RUN_NAME
    worker, result = start_streaming(cfg)
    try:
        # maintenance has run at least twice while batches were still being appended
        wait_until_sync(lambda: stamp.exists(), timeout=120, what="the first maintenance look")
        first = stamp.stat().st_mtime
        expected = sorted(expected + land(root, partitions=2, files=3, records=200, first_file=3))
        wait_until_sync(
            lambda: stamp.stat().st_mtime > first + 1 and _rows(spark, tmp_path) == len(expected),
            timeout=240,
            what="every record in the table, maintained since",
        )
        # the file bound holds after a compaction that saw every batch: one run after the last
        everything_in = time.time()
        wait_until_sync(
            lambda: stamp.stat().st_mtime > everything_in,
            timeout=120,
            what="a maintenance run after the last batch",
        )
    finally:
        stop_streaming(spark, worker, timeout=120)
    assert not worker.is_alive() and result["code"] == 0
    out = Path(cfg.spark.output_dir)
    assert_exact(spark, out, expected)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{out}`").select("operation").collect()
    assert "OPTIMIZE" in {r.operation for r in history}
    for part, (files, size) in active_files_by_partition(out).items():
        assert files <= 2 * math.ceil(size / cfg.spark.target_file_size), part


def _rows(spark: Any, root: Path) -> int:
    out = root / "events"
    if existing_format(out) != "delta":
        return 0
    return int(spark.read.format("delta").load(str(out)).count())


def test_table_commands_are_refused_while_the_job_runs(tmp_path: Path) -> None:
    """`mqd table optimize` while the job holds its lock exits 75 and says why; the job's own start
    while a table command holds it is refused the same way (TableBusy)."""
    cfg_path = tmp_path / "mqd.toml"
    cfg_path.write_text(
        f'[landing]\ndir = "{tmp_path / "landing"}"\n[spark]\noutput_dir = "{tmp_path / "events"}"\n'
        f'checkpoint_dir = "{tmp_path / "ckpt"}"\n'
    )
    (tmp_path / "events" / "_delta_log").mkdir(parents=True)
    (tmp_path / "events" / "_delta_log" / "00000000000000000000.json").write_text("{}\n")
    cfg = make_config(tmp_path)
    with job_lock(cfg):
        res = mqd("table", "optimize", "--config", str(cfg_path), timeout=60)
        assert res.returncode == 75, res.stderr
        assert "is running" in res.stderr and "maintenance_interval" in res.stderr
        with pytest.raises(TableBusy):
            with job_lock(cfg):
                pass


def test_maintenance_is_due_an_interval_after_the_first_look(tmp_path: Path) -> None:
    """A table never maintained is not compacted at once: its clock starts at the first look."""
    cfg = make_config(tmp_path, maintenance_interval=60.0)
    schedule = MaintenanceSchedule(cfg, [str(tmp_path / "events")])
    assert not schedule.due()
    assert not schedule.due(now=time.time() + 59)
    assert schedule.due(now=time.time() + 61)
    off = MaintenanceSchedule(make_config(tmp_path / "off", maintenance_interval=0.0), [])
    assert not off.due(now=time.time() + 10**9)


def test_a_parquet_table_converts_from_its_log_not_its_folder(tmp_path: Path, spark: Any) -> None:
    """`mqd table convert` makes an old parquet table Delta from the files _spark_metadata lists: an
    orphan file (a killed batch's) stays out, every reader then counts each record once, and the
    job goes on appending to the converted table from its old checkpoint."""
    expected = land(tmp_path / "landing", partitions=2, files=2, records=50)
    old = make_config(tmp_path, table_format="parquet")
    assert job.run(old, once=True) == 0
    out = Path(old.spark.output_dir)
    part_dir = next(p for p in out.rglob("dt=*") if p.is_dir())
    orphan = part_dir / "part-99999-orphan.c000.snappy.parquet"
    some = next(part_dir.glob("*.parquet"))
    pq.write_table(pq.read_table(some), orphan)  # valid Parquet, in no commit: a killed batch's file
    cfg_path = tmp_path / "mqd.toml"
    cfg_path.write_text(
        f'[landing]\ndir = "{tmp_path / "landing"}"\n[spark]\noutput_dir = "{out}"\n'
        f'checkpoint_dir = "{old.spark.checkpoint_dir}"\nmaster = "local[1]"\n'
    )
    res = mqd("table", "convert", "--config", str(cfg_path), timeout=300, env={"MQD_LOG__LEVEL": "warning"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "parquet -> delta" in res.stdout
    assert existing_format(out) == "delta"
    for reader, keys in every_reader_keys(out).items():
        assert offsets(keys) == expected, reader
    assert orphan.exists()  # left for VACUUM, read by nobody

    expected = sorted(expected + land(tmp_path / "landing", partitions=1, files=1, records=50, first_file=2))
    assert job.run(make_config(tmp_path), once=True) == 0
    assert_exact(spark, out, expected)
