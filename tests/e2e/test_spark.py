"""The PySpark job on a real landing directory and a real (local) Spark session.

One Spark session serves the whole module (starting one costs 10-20 s); mqd.spark.job.run reuses
an active session, so each test runs the real job code in-process.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.delta import read_delta
from support.spark_job import start_streaming, stop_streaming

from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher
from mqd.spark import job
from mqd.spark.table_format import existing_format
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def make_config(root: Path, **spark_kw: Any) -> MqdConfig:
    return MqdConfig(
        landing=LandingConfig(dir=root / "landing"),
        spark=SparkConfig(
            output_dir=root / "out",
            checkpoint_dir=root / "ckpt",
            quarantine_dir=root / "quarantine",
            shuffle_partitions=2,
            max_files_per_trigger=2,
            **spark_kw,
        ),
    )


def publish(
    pub: Publisher, topic: str, partition: int, first: int, values: list[bytes | None], ts: int
) -> None:
    """``values`` landed from offset ``first``; a None is a tombstone (a null value, as the Kafka
    source lands one)."""
    plain = [v if v is not None else b"" for v in values]
    raw = fmt.encode_batch(plain, timestamps=np.full(len(values), ts, dtype=np.int64), base_offset=first)
    table = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    if None in values:
        i = table.schema.get_field_index("value")
        table = table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))
    last = pub.store.head(topic, partition).last_offset
    pub.publish(topic, partition, table, last)


def test_raw_job_drains_landing_once_and_stops_at_corrupt_files(tmp_path: Path, spark: Any) -> None:
    """--once appends every landed record exactly once, across runs (checkpoint), partitioned by
    topic and dt; a foreign file is reported and left out; a corrupt .parquet is reported and
    fails the job (exit 1, nothing skipped) until it is moved away."""
    cfg = make_config(tmp_path)
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    for p in range(3):
        publish(pub, "events", p, 0, [b"a%d" % i for i in range(50)], T0 + p)
        publish(pub, "events", p, 50, [b"b%d" % i for i in range(50)], T0 + 3_600_000 + p)
    hour_dir = Path(cfg.landing.dir) / "topic=events/dt=2026-01-01/hour=00"
    corrupt = hour_dir / "part-00009-00000000000000000000.parquet"
    corrupt.write_bytes(b"PAR1 definitely not parquet")
    (hour_dir / "README.txt").write_text("someone's notes")
    pq.write_table(pa.table({"a": [1, 2]}), hour_dir / "foreign.parquet")
    stray = job.unlisted_files(Path(cfg.landing.dir))
    assert [p.name for p in stray] == [
        "README.txt",
        "foreign.parquet",
        "part-00009-00000000000000000000.parquet",
    ]

    assert job.run(cfg, once=True) == 1
    corrupt.unlink()  # the operator moves it out of the landing directory
    assert job.run(cfg, once=True) == 0
    out = read_delta(spark, cfg.spark.output_dir)
    assert out.count() == 300
    assert out.select("topic", "partition", "offset").distinct().count() == 300
    assert sorted(str(r.dt) for r in out.select("dt").distinct().collect()) == ["2026-01-01"]
    assert sorted(r.hour for r in out.select("hour").distinct().collect()) == [0, 1]
    assert (Path(cfg.spark.output_dir) / "topic=events" / "dt=2026-01-01").is_dir()

    publish(pub, "events", 0, 100, [b"c"] * 25, T0 + 7_200_000)
    assert job.run(cfg, once=True) == 0
    out = read_delta(spark, cfg.spark.output_dir)
    assert out.count() == 325
    assert out.select("topic", "partition", "offset").distinct().count() == 325


def test_json_values_become_columns_and_bad_records_are_dead_lettered(tmp_path: Path, spark: Any) -> None:
    """value_format = "json": good values become typed columns and a tombstone a row with null
    fields; malformed JSON, a non-object and values that do not fit the schema land in the
    dead-letter table whole, with their error class and message, none dropped; the batch log
    lines and the job's metrics file count them per class."""
    import structlog
    from prometheus_client.parser import text_string_to_metric_families

    cfg = make_config(tmp_path, value_format="json", value_schema="user STRING, amount INT")
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    values: list[bytes | None] = [json.dumps({"user": f"u{i}", "amount": i}).encode() for i in range(20)]
    values += [b"{not json", b'{"user": "x", "amount": "lots"}', b"[1, 2]", None]
    publish(pub, "payments", 0, 0, values, T0)
    foreign = Path(cfg.landing.dir) / "topic=payments/dt=2026-01-01/hour=00/foreign.parquet"
    pq.write_table(pa.table({"a": [1]}), foreign)
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 0
    good = spark.read.format("delta").load(str(cfg.spark.output_dir))
    bad = spark.read.format("delta").load(str(cfg.spark.quarantine_dir))
    assert good.count() + bad.count() == 25
    assert sorted(r.amount for r in good.where("amount IS NOT NULL").select("amount").collect()) == list(
        range(20)
    )
    [tombstone] = good.where("offset = 23").collect()
    assert tombstone.user is None and tombstone.amount is None
    assert "value" not in good.columns and "user" in good.columns
    rows = {r.offset: r for r in bad.where("offset IS NOT NULL").collect()}
    assert {o: r.error_class for o, r in rows.items()} == {
        20: "not_json",
        21: "schema_mismatch",
        22: "not_json",
    }
    assert rows[21].value == b'{"user": "x", "amount": "lots"}' and rows[21].partition == 0
    assert all(r.error_message and r.schema_id is None and r.dead_lettered_at for r in rows.values())
    [alien] = bad.where("offset IS NULL").collect()
    assert alien.error_class == "foreign_file" and alien.source_file.endswith("foreign.parquet")

    dead = [e for e in logs if e["event"] == "spark_batch_done" and e["query"].endswith("-quarantine")]
    assert sum(e["dead_letter_not_json"] for e in dead) == 2
    assert sum(e["dead_letter_schema_mismatch"] for e in dead) == 1
    assert sum(e["dead_letter_foreign_file"] for e in dead) == 1
    text = (Path(cfg.spark.checkpoint_dir) / "metrics.prom").read_text()
    by_class = {
        s.labels.get("error_class"): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "mqd_spark_dead_letter_rows_total"
    }
    assert by_class == {"not_json": 2, "schema_mismatch": 1, "foreign_file": 1}


def test_bad_partition_column_is_a_config_error(tmp_path: Path, spark: Any) -> None:
    """A partition_by column that the output does not have is refused: by the config, and by the
    job (exit code 2) for a config that skipped validation (model_copy)."""
    with pytest.raises(ValueError, match="partition_by"):
        make_config(tmp_path, partition_by=["nope"])
    cfg = make_config(tmp_path)
    cfg = cfg.model_copy(update={"spark": cfg.spark.model_copy(update={"partition_by": ["nope"]})})
    LocalStore(Path(cfg.landing.dir)).open()
    assert job.run(cfg, once=True) == 2


def _rows(spark: Any, path: Path | str) -> int:
    """Rows committed to the (Delta) output table so far (0 before its first micro-batch). Through
    its log: a folder read also lists the file a running batch is writing, and failed on its footer."""
    if existing_format(Path(path)) != "delta":
        return 0
    return int(spark.read.format("delta").load(str(path)).count())


def test_run_from_another_thread_leaves_the_callers_session_running(tmp_path: Path, spark: Any) -> None:
    """``job.run`` stops only a session it created: run from a worker thread (where Spark's active
    session is not set, it is per thread), it must leave the caller's session usable."""
    cfg = make_config(tmp_path)
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    publish(pub, "events", 0, 0, [b"x"] * 3, T0)
    result: dict[str, int] = {}
    worker = threading.Thread(target=lambda: result.setdefault("code", job.run(cfg, once=True)))
    worker.start()
    worker.join(120)
    assert not worker.is_alive() and result == {"code": 0}
    assert _rows(spark, cfg.spark.output_dir) == 3  # raises if run() stopped the session


def test_continuous_mode_appends_new_files_until_stopped(tmp_path: Path, spark: Any) -> None:
    """Without --once the job keeps running: files published after it started reach the table;
    stopping its queries ends run() with exit code 0."""
    cfg = make_config(tmp_path, trigger_interval="1 second")
    pub = Publisher(LocalStore(Path(cfg.landing.dir)))
    pub.store.open()
    publish(pub, "events", 0, 0, [b"x"] * 10, T0)
    worker, result = start_streaming(cfg)
    try:
        for want in (10, 15):
            deadline = time.monotonic() + 60
            while _rows(spark, cfg.spark.output_dir) < want:
                assert time.monotonic() < deadline, f"table never reached {want} rows"
                time.sleep(0.5)
            if want == 10:
                publish(pub, "events", 0, 10, [b"y"] * 5, T0 + 1)
        assert _rows(spark, cfg.spark.output_dir) == 15
    finally:
        stop_streaming(spark, worker, timeout=30)
    assert not worker.is_alive() and result["code"] == 0
