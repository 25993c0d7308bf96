"""Typed records end to end: Avro values in the registry's wire format, decoded by their writer
schemas fetched from a real registry (Apicurio, Confluent's API), land as typed columns of the
Delta (and Iceberg) table that follow the subject's evolution without a restart; every record that
cannot be decoded is in the dead-letter table with its class and reason; nothing is lost or twice."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import deltalake
import polars as pl
import pytest
from structlog.testing import capture_logs
from support.iceberg_readers import every_iceberg_reader_column, every_iceberg_reader_keys
from support.spark_job import start_streaming, stop_streaming
from support.table_readers import every_reader_keys
from support.typed import avro_value, land_values, record_schema, register, registry, typed_config

from mqd.spark import job
from mqd.spark.job import DEAD_LETTER_STAMP_DIR
from mqd.spark.job_metrics import FILE_NAME
from mqd.spark.table_maintenance import LAST_RUN_NAME
from mqd.testing.schema_registry import SchemaRegistry
from mqd.waiting import wait_until_sync

pytestmark = pytest.mark.spark
__all__ = ["registry"]  # the module's fixture

V1 = record_schema("Order", ("id", "long"), ("name", "string"), ("timestamp", "long"))
V2 = record_schema(
    "Order", ("id", "long"), ("name", "string"), ("timestamp", "long"), ("score", ["null", "double"])
)
V3 = record_schema(
    "Order", ("id", "long"), ("timestamp", "long"), ("score", ["null", "double"])
)  # name removed
BAD = record_schema("Order", ("id", "string"))  # id re-typed: the table's bigint cannot take it


def _rows(table: Path) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(str(table)).to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])


def _count(table: Path) -> int:
    """Rows of the Delta table, 0 while it has no commit yet."""
    if not any((table / "_delta_log").glob("*.json")):
        return 0
    return int(deltalake.DeltaTable(str(table)).to_pyarrow_table().num_rows)


def test_versions_of_one_subject_land_in_one_table_and_restarts_judge_alike(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """v1 and v2 records in one run: the table has v2's new column (null for v1 rows); a later run
    (a restart: the columns are read back from the table) lands v3, which dropped `name`: null there.
    The value's `timestamp` field, a name the table already has, is the column `value_timestamp`.
    delta-rs, Polars and DuckDB read the same typed rows."""
    subject = "orders-evolve-value"
    i1, i2, i3 = (register(registry, subject, s) for s in (V1, V2, V3))
    cfg = typed_config(tmp_path, registry.url)
    landing = Path(cfg.landing.dir)
    land_values(landing, [avro_value(i1, V1, {"id": n, "name": f"n{n}", "timestamp": n}) for n in range(5)])
    land_values(
        landing,
        [avro_value(i2, V2, {"id": n, "name": "x", "timestamp": n, "score": n / 2}) for n in range(5, 10)],
    )
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    rows = _rows(out)
    assert [r["id"] for r in rows] == list(range(10))
    assert [r["score"] for r in rows] == [None] * 5 + [n / 2 for n in range(5, 10)]
    assert rows[0]["value_timestamp"] == 0 and rows[0]["timestamp"] is not None  # the Kafka time stays

    land_values(landing, [avro_value(i3, V3, {"id": n, "timestamp": n, "score": 1.0}) for n in range(10, 13)])
    assert job.run(cfg, once=True) == 0
    rows = _rows(out)
    assert [r["id"] for r in rows] == list(range(13))
    assert [r["name"] for r in rows[10:]] == [None] * 3 and rows[9]["name"] == "x"
    schema = deltalake.DeltaTable(str(out)).to_pyarrow_table().schema
    assert {"id": "int64", "name": "string", "score": "double", "value_timestamp": "int64"}.items() <= {
        f.name: str(f.type).replace("large_", "") for f in schema
    }.items()
    assert "value" not in schema.names
    assert pl.read_delta(str(out)).select(pl.col("score").sum()).item() == pytest.approx(
        sum(n / 2 for n in range(5, 10)) + 3
    )
    for reader, keys in every_reader_keys(out).items():
        assert [k[3] for k in keys] == list(range(13)), reader
    assert not Path(cfg.spark.quarantine_dir).exists()  # no dead letter: no dead-letter table


def test_every_undecodable_record_is_a_dead_letter_with_its_reason(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """One batch holding good records and one of each failure: not the wire format, an id the
    registry does not have, a payload its schema cannot decode, a writer schema the table's columns
    cannot take, a Protobuf schema under value_format = "avro". Each is a dead-letter row with its
    raw value, coordinates, schema id, class and message; the good ones are rows of the table;
    together exactly the landed offsets; the metrics file counts the dead letters per class."""
    subject = "orders-dead-value"
    good = register(registry, subject, V1)
    bad = register(registry, "orders-dead-bad-value", BAD)
    proto = register(
        registry, "orders-dead-proto-value", 'syntax = "proto3";\nmessage M { int64 id = 1; }\n', "PROTOBUF"
    )
    cfg = typed_config(tmp_path, registry.url)
    landing = Path(cfg.landing.dir)
    values = [avro_value(good, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(4)]
    failing = {
        "not_wire_format": b"plain text",
        "unknown_schema": avro_value(2**31 - 7, V1, {"id": 1, "name": "a", "timestamp": 1}),
        "decode_failed": avro_value(good, V1, {"id": 1, "name": "a", "timestamp": 1})[:6] + b"\xff",
        "schema_incompatible": avro_value(bad, BAD, {"id": "x"}),
        "unsupported_schema": avro_value(proto, V1, {"id": 1, "name": "a", "timestamp": 1}),
    }
    # the table's first writer defines `id` as bigint before BAD's id is judged
    offsets = land_values(landing, values + list(failing.values()))
    assert job.run(cfg, once=True) == 0
    table = _rows(Path(cfg.spark.output_dir))
    dead = sorted(
        deltalake.DeltaTable(str(cfg.spark.quarantine_dir)).to_pyarrow_table().to_pylist(),
        key=lambda r: r["offset"],
    )
    assert sorted([r["offset"] for r in table] + [r["offset"] for r in dead]) == offsets
    assert [r["id"] for r in table] == list(range(4))
    assert [(r["error_class"], r["value"]) for r in dead] == list(failing.items())
    by_class = {r["error_class"]: r for r in dead}
    assert by_class["unknown_schema"]["schema_id"] == 2**31 - 7
    assert str(2**31 - 7) in by_class["unknown_schema"]["error_message"]
    assert "field id is string" in by_class["schema_incompatible"]["error_message"]
    assert "PROTOBUF" in by_class["unsupported_schema"]["error_message"]
    assert by_class["not_wire_format"]["schema_id"] is None
    assert all(r["source_file"].endswith(".parquet") and r["partition"] == 0 for r in dead)
    metrics = (Path(cfg.spark.checkpoint_dir) / FILE_NAME).read_text()
    for name in failing:
        assert f'error_class="{name}"}} 1' in metrics, metrics


def test_a_new_field_adds_a_column_to_a_running_stream(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """The stream is running with v1 records landed; v2 records (a new optional field) land: the
    table gains the column and the rows, without a restart."""
    subject = "orders-stream-value"
    i1, i2 = register(registry, subject, V1), register(registry, subject, V2)
    cfg = typed_config(tmp_path, registry.url, trigger_interval="1s")
    landing = Path(cfg.landing.dir)
    land_values(landing, [avro_value(i1, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(3)])
    out = Path(cfg.spark.output_dir)
    worker, result = start_streaming(cfg)
    try:
        wait_until_sync(lambda: _count(out) == 3, timeout=120)
        land_values(
            landing,
            [avro_value(i2, V2, {"id": n, "name": "b", "timestamp": n, "score": 2.0}) for n in range(3, 5)],
        )
        wait_until_sync(lambda: _count(out) == 5, timeout=120)
        assert worker.is_alive()
        assert [r["score"] for r in _rows(out)] == [None, None, None, 2.0, 2.0]
    finally:
        stop_streaming(spark, worker, timeout=60)
    assert result.get("code") == 0


def test_a_batch_run_again_adds_nothing_to_either_table(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """A crash after the batch's writes but before its checkpoint commit (the commit file removed)
    makes the next run write the batch again: each table's log already holds the query's batch
    (Delta's txn), so neither the table nor the dead letters gain a row."""
    i1 = register(registry, "orders-again-value", V1)
    cfg = typed_config(tmp_path, registry.url)
    land_values(Path(cfg.landing.dir), [avro_value(i1, V1, {"id": 1, "name": "a", "timestamp": 1}), b"junk"])
    assert job.run(cfg, once=True) == 0
    commits = sorted((Path(cfg.spark.checkpoint_dir) / "main" / "commits").glob("[0-9]*"))
    assert commits
    commits[-1].unlink()
    commits[-1].with_name(f".{commits[-1].name}.crc").unlink(missing_ok=True)
    assert job.run(cfg, once=True) == 0
    assert len(_rows(Path(cfg.spark.output_dir))) == 1
    assert deltalake.DeltaTable(str(cfg.spark.quarantine_dir)).to_pyarrow_table().num_rows == 1


def test_a_registry_that_does_not_answer_fails_the_run_and_dead_letters_nothing(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """The registry unreachable past spark.schema_registry.retry_timeout is an outage, not a bad
    record: the run exits 1 naming the registry, no table or dead letter is written; with the
    registry back the next run lands every record."""
    i1 = register(registry, "orders-outage-value", V1)
    from mqd.testing.cluster import free_port

    dead_url = f"http://127.0.0.1:{free_port()}"
    cfg = typed_config(tmp_path, dead_url, schema_registry={"url": dead_url, "retry_timeout": "2s"})
    land_values(
        Path(cfg.landing.dir), [avro_value(i1, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(3)]
    )
    assert job.run(cfg, once=True) == 1
    assert not Path(cfg.spark.quarantine_dir).exists()
    assert not (Path(cfg.spark.output_dir) / "_delta_log").exists()
    assert job.run(typed_config(tmp_path, registry.url), once=True) == 0
    assert [r["id"] for r in _rows(Path(cfg.spark.output_dir))] == [0, 1, 2]


def test_an_avro_key_is_a_typed_key_column(tmp_path: Path, spark: Any, registry: SchemaRegistry) -> None:
    """key_format = "avro" with a string key schema: the table's `key` is the decoded string."""
    ki = register(registry, "orders-key-key", json.dumps("string"))
    vi = register(registry, "orders-key-value", V1)
    cfg = typed_config(tmp_path, registry.url, key_format="avro")
    keys = [avro_value(ki, "string", f"k{n}") for n in range(3)]
    values = [avro_value(vi, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(3)]
    land_values(Path(cfg.landing.dir), values, keys=keys)
    assert job.run(cfg, once=True) == 0
    assert [r["key"] for r in _rows(Path(cfg.spark.output_dir))] == ["k0", "k1", "k2"]


def test_an_iceberg_table_takes_typed_rows_and_its_dead_letters(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """table_format = "iceberg": v1 and v2 rows in one typed Iceberg table (v2's column added by the
    sink's schema union), a non-wire-format record in the Iceberg dead-letter table; pyiceberg, DuckDB
    and Polars read the typed column."""
    subject = "orders-iceberg-value"
    i1, i2 = register(registry, subject, V1), register(registry, subject, V2)
    cfg = typed_config(tmp_path, registry.url, table_format="iceberg")
    landing = Path(cfg.landing.dir)
    land_values(landing, [avro_value(i1, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(3)])
    land_values(landing, [avro_value(i2, V2, {"id": 3, "name": "b", "timestamp": 3, "score": 1.5}), b"junk"])
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    for reader, rows in every_iceberg_reader_column(out, "score").items():
        assert [r[2] for r in rows if r[2] is not None] == [1.5] and len(rows) == 4, reader
    dead = every_iceberg_reader_keys(Path(cfg.spark.quarantine_dir))
    assert all([k[3] for k in keys] == [4] for keys in dead.values()), dead


def test_a_new_checkpoint_for_a_typed_table_is_refused(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """The typed sink's writes carry the query and batch as Delta's txn: the checkpoint guard reads
    them, so a deleted checkpoint ends the next run with exit 2 instead of writing every landed
    record again."""
    i1 = register(registry, "orders-guard-value", V1)
    cfg = typed_config(tmp_path, registry.url)
    land_values(Path(cfg.landing.dir), [avro_value(i1, V1, {"id": 1, "name": "a", "timestamp": 1})])
    assert job.run(cfg, once=True) == 0
    import shutil

    shutil.rmtree(cfg.spark.checkpoint_dir)
    assert job.run(cfg, once=True) == 2
    assert len(_rows(Path(cfg.spark.output_dir))) == 1


def test_a_frozen_registry_delays_the_batch_and_dead_letters_nothing(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """The registry frozen (SIGSTOP) for 30 s when the batch needs a schema: the job waits with
    backoff and says so (schema_registry_unreachable, more than once), and once the registry is
    thawed it lands every record; nothing is dead-lettered for the outage."""
    i1 = register(registry, "orders-frozen-value", V1)
    url = registry.url
    cfg = typed_config(
        tmp_path, url, schema_registry={"url": url, "request_timeout": "1s", "retry_timeout": "5m"}
    )
    land_values(
        Path(cfg.landing.dir), [avro_value(i1, V1, {"id": n, "name": "a", "timestamp": n}) for n in range(4)]
    )
    proc = registry.process
    assert proc is not None
    result: dict[str, int] = {}
    with capture_logs() as logs:
        proc.send_signal(signal.SIGSTOP)
        thaw_at = time.monotonic() + 30.0  # the outage: longer than a few backoff rounds
        try:
            worker = threading.Thread(target=lambda: result.setdefault("code", job.run(cfg, once=True)))
            worker.start()
            wait_until_sync(
                lambda: (
                    time.monotonic() >= thaw_at
                    and sum(e["event"] == "schema_registry_unreachable" for e in logs) >= 2
                ),
                timeout=120,
            )
            assert worker.is_alive(), "the job ended while the registry was frozen"
        finally:
            proc.send_signal(signal.SIGCONT)
        worker.join(180)
    assert result.get("code") == 0
    assert [r["id"] for r in _rows(Path(cfg.spark.output_dir))] == [0, 1, 2, 3]
    assert not Path(cfg.spark.quarantine_dir).exists()


@pytest.mark.timeout(600)  # four Spark jobs of maintenance after the batches (OPTIMIZE and VACUUM twice)
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_the_typed_table_and_its_dead_letters_are_both_maintained(
    tmp_path: Path, spark: Any, registry: SchemaRegistry, table_format: str
) -> None:
    """The typed sink writes two tables from one query; maintenance compacts both (the dead-letter
    table has no query of its own, so the schedule must name it): after batches of one file each,
    with maintenance due, each table logs a compaction that removed files, and both still hold
    exactly the landed records."""
    i1 = register(registry, "orders-maintained-value", V1)
    cfg = typed_config(
        tmp_path,
        registry.url,
        table_format=table_format,
        max_files_per_trigger=1,
        maintenance_interval=0.001,
        target_file_size="1MiB",
    )
    landing = Path(cfg.landing.dir)
    offsets: list[int] = []
    for f in range(2):
        good = [avro_value(i1, V1, {"id": f * 10 + n, "name": "a", "timestamp": n}) for n in range(3)]
        offsets += land_values(landing, [*good, b"junk"])
    # due from the first look: each schedule's clock an interval old (its stamp's mtime)
    ckpt = Path(cfg.spark.checkpoint_dir)
    clocks = [ckpt] if table_format == "delta" else [ckpt / "main", ckpt / "main" / DEAD_LETTER_STAMP_DIR]
    for clock in clocks:
        path = clock / LAST_RUN_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (0, 0))
    with capture_logs() as logs:
        assert job.run(cfg, once=True) == 0
    out, dead = cfg.spark.output_dir, cfg.spark.quarantine_dir
    compacted = {str(e["table"]) for e in logs if e["event"] == "table_maintained" and e["files_removed"] > 0}
    assert {str(out), str(dead)} <= compacted, [e for e in logs if "maint" in e["event"]]
    read = every_reader_keys if table_format == "delta" else every_iceberg_reader_keys
    for reader, table_keys in read(Path(out)).items():
        dead_keys = read(Path(dead))[reader]
        assert len(table_keys) == 6 and len(dead_keys) == 2, reader
        assert sorted(k[3] for k in table_keys + dead_keys) == sorted(offsets), reader
