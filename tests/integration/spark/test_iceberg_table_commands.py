"""`mqd table describe|optimize|vacuum` on an Iceberg table (spark.table_format = "iceberg"): pyiceberg
in the command's own process, no Spark; refused while the job holds its lock."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from support.delta import make_config
from support.iceberg_batches import batch

from mqd.operator.cli import main
from mqd.spark.iceberg_sink import IcebergSink
from mqd.spark.table_maintenance import job_lock


def test_table_commands_read_and_maintain_an_iceberg_table(tmp_path: Path) -> None:
    """Five one-batch files: describe counts them and their rows; optimize compacts them into one;
    vacuum with the config's retention keeps the recent snapshots; all while the lock is free, and
    optimize is refused (exit 75) while the job holds it."""
    cfg_path = tmp_path / "mqd.toml"
    cfg_path.write_text(
        f'[landing]\ndir = "{tmp_path / "landing"}"\n[spark]\ntable_format = "iceberg"\n'
        f'output_dir = "{tmp_path / "events"}"\ncheckpoint_dir = "{tmp_path / "ckpt"}"\n'
    )
    sink = IcebergSink(tmp_path / "events", partition_by=["topic"])
    for b in range(5):
        assert sink.write_batch(batch(b * 10, 10), "q", b)
    runner = CliRunner()

    got = runner.invoke(main, ["table", "describe", "--config", str(cfg_path), "--json"])
    assert got.exit_code == 0, got.output
    info = json.loads(got.output)
    assert (info["files"], info["rows"], info["partition_columns"]) == (5, 50, ["topic (identity)"])

    got = runner.invoke(main, ["table", "optimize", "--config", str(cfg_path)])
    assert got.exit_code == 0 and "5 files compacted into 1" in got.output, got.output
    got = runner.invoke(main, ["table", "vacuum", "--config", str(cfg_path)])
    assert got.exit_code == 0 and "0 snapshots expired" in got.output, got.output
    info = json.loads(runner.invoke(main, ["table", "describe", "-c", str(cfg_path), "--json"]).output)
    assert (info["files"], info["rows"], info["last_operation"]) == (1, 50, "compaction")

    with job_lock(make_config(tmp_path)):
        got = runner.invoke(main, ["table", "optimize", "--config", str(cfg_path)])
        assert got.exit_code == 75 and "is running" in got.output, got.output


def test_describe_without_a_table_names_the_place(tmp_path: Path) -> None:
    """No Iceberg table at the output yet: exit 2 naming it, not a traceback."""
    cfg_path = tmp_path / "mqd.toml"
    cfg_path.write_text(f'[spark]\ntable_format = "iceberg"\noutput_dir = "{tmp_path / "events"}"\n')
    got = CliRunner().invoke(main, ["table", "describe", "--config", str(cfg_path)])
    assert got.exit_code == 2 and str(tmp_path / "events") in got.output, got.output
