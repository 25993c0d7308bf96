"""The job writes a Delta Lake table (spark.table_format = "delta", the default) that every engine
reads exactly: Spark, delta-rs, Polars and DuckDB count each landed record once, also after the job
was SIGKILLed in the middle of a batch, whose files are in no Delta commit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from click.testing import CliRunner
from support.config import write_file
from support.delta import assert_exact, land, make_config, spark_keys
from support.table_readers import every_reader_keys, offsets

from mqd.config import check_file
from mqd.operator.cli import main
from mqd.spark import job
from mqd.spark.table_format import existing_format
from mqd.waiting import wait_until_sync

pytestmark = pytest.mark.spark


def test_every_reader_counts_each_record_once(tmp_path: Path, spark: Any) -> None:
    """N landed records -> `--once` -> a Delta table (not Spark's file sink: a _delta_log, no
    _spark_metadata) in which Spark, delta-rs, Polars and DuckDB each see exactly the N keys, again
    after a second run appends more."""
    cfg = make_config(tmp_path)
    expected = land(Path(cfg.landing.dir), partitions=3, files=3, records=40)
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    assert existing_format(out) == "delta" and not (out / "_spark_metadata").exists()
    assert_exact(spark, out, expected)

    expected = sorted(expected + land(Path(cfg.landing.dir), partitions=1, files=2, records=40, first_file=3))
    assert job.run(cfg, once=True) == 0
    assert_exact(spark, out, expected)


def test_a_format_other_than_the_tables_is_refused(tmp_path: Path, spark: Any) -> None:
    """A parquet table (mqd before table formats) is not written as Delta, nor the reverse: the job
    exits 2 and `mqd config check` names the key, the file and the way out."""
    land(tmp_path / "landing", partitions=1, files=1, records=5)
    old = make_config(tmp_path, table_format="parquet")
    assert job.run(old, once=True) == 0
    assert existing_format(Path(old.spark.output_dir)) == "parquet"
    assert job.run(make_config(tmp_path), once=True) == 2

    path = write_file(
        tmp_path,
        f'[landing]\ndir = "{tmp_path / "landing"}"\n[spark]\noutput_dir = "{tmp_path / "events"}"\n',
    )
    assert check_file(path)[0] == "daemon"  # the file alone is valid: the tables are looked at apart
    res = CliRunner().invoke(main, ["config", "check", str(path)])
    assert res.exit_code == 2, res.output
    msg = res.stderr
    assert str(path) in msg and "spark.table_format" in msg and "mqd table convert" in msg


def _config_file(tmp_path: Path, **spark: Any) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in spark.items())
    return write_file(
        tmp_path,
        f'[landing]\ndir = "{tmp_path / "landing"}"\n'
        f'[spark]\noutput_dir = "{tmp_path / "events"}"\ncheckpoint_dir = "{tmp_path / "ckpt"}"\n'
        f'master = "local[2]"\nshuffle_partitions = 2\n{extra}',
    )


def _data_files(table: Path) -> list[Path]:
    return [p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts]


def _uncommitted(table: Path) -> list[Path]:
    """Data files that no commit of the Delta log adds (a batch being written, or a killed one's)."""
    log = table / "_delta_log"
    if existing_format(table) != "delta":
        return []
    added: set[str] = set()
    for commit in log.glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                added.add(unquote(action["add"]["path"]))
    return [p for p in _data_files(table) if str(p.relative_to(table)) not in added]


@pytest.mark.slow
def test_a_job_killed_mid_batch_leaves_nothing_any_reader_sees(tmp_path: Path, spark: Any) -> None:
    """`mqd spark --once` SIGKILLed while a batch's files are written after an earlier batch made
    the table (frozen first, so the kill lands before that batch's commit): every reader still counts
    exactly what the Delta log commits, none errors on the killed batch's files, and the restarted
    job adds each record once."""
    expected = land(tmp_path / "landing", partitions=4, files=6, records=2_000)
    path = _config_file(tmp_path, max_files_per_trigger=4)
    out = tmp_path / "events"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqd.operator.cli", "spark", "--config", str(path), "--once"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until_sync(
            lambda: bool(_uncommitted(out)) or proc.poll() is not None, timeout=240, interval=0.005
        )
        proc.send_signal(signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert _uncommitted(out), "the job ended before it was caught between a batch's files and its commit"

    committed = spark_keys(spark, out)
    assert 0 < len(committed) < len(expected) and len(committed) == len(set(committed))
    assert set(offsets(committed)) <= set(expected)
    for reader, keys in every_reader_keys(out).items():
        assert keys == committed, reader

    res = subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "spark", "--config", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert_exact(spark, out, expected)
