"""spark.partition_by with event-time expressions and Iceberg transforms, and the value's fields the
schema does not name: every record lands once, in its event day or the default partition, counted;
extra fields are kept in `_extra` (mqd/spark/partitioning.py, mqd/spark/job.py)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pytest
import structlog
from support.delta import T0, land_values, make_config
from support.iceberg_readers import every_iceberg_reader_keys
from support.table_readers import every_reader_keys, offsets

from mqd.landing import LocalStore, Publisher
from mqd.spark import job
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark

DAY_MS = 86_400_000


def event_values(n: int) -> tuple[list[bytes], dict[int, str | None]]:
    """JSON values whose `ts` spans five days; every 10th has no `ts`, every 15th an unparsable one;
    every value has a `seq` the schema will not name. Returns the values and each offset's day."""
    values: list[bytes] = []
    days: dict[int, str | None] = {}
    for i in range(n):
        record: dict[str, Any] = {"id": i, "seq": i * 2}
        day = date.fromtimestamp((T0 + (i % 5) * DAY_MS) / 1000).isoformat()
        if i % 10 == 0:
            days[i] = None
        elif i % 15 == 0:
            record["ts"] = "2026-13-45 not a time"
            days[i] = None
        else:
            record["ts"] = f"{day}T12:00:00Z"
            days[i] = day
        values.append(json.dumps(record).encode())
    return values, days


def test_records_land_in_their_event_day_or_the_default_partition(tmp_path: Path, spark: Any) -> None:
    """`to_date(ts) AS dt` replaces the Kafka day with the event day: 250 records over five days
    land in five dt partitions, those without a parsable ts in the null (default) partition; every
    reader counts each record once; the batch log line counts the default partition and the extra
    `seq` field, which is kept in `_extra` with its JSON type."""
    values, days = event_values(250)
    expected = land_values(tmp_path / "landing", values)
    cfg = make_config(
        tmp_path,
        value_format="json",
        value_schema="id INT, ts STRING",
        partition_by=["topic", "to_date(ts) AS dt"],
    )
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    for reader, keys in every_reader_keys(out).items():
        assert offsets(keys) == expected, reader

    table = deltalake.DeltaTable(str(out))
    assert table.metadata().partition_columns == ["topic", "dt"]
    rows = table.to_pyarrow_table(columns=["offset", "dt", "_extra"]).to_pylist()
    got = {r["offset"]: (r["dt"].isoformat() if r["dt"] is not None else None) for r in rows}
    assert got == days
    assert len({d for d in got.values() if d is not None}) == 5
    assert all(json.loads(r["_extra"]) == {"seq": r["offset"] * 2} for r in rows)

    batches = [e for e in logs if e["event"] == "spark_batch_done" and e["query"] == job.query_name(cfg)]
    assert sum(e["rows_out"] for e in batches) == 250
    assert sum(e["default_partition_rows"] for e in batches) == sum(d is None for d in days.values())
    assert sum(e["extra_field_rows"] for e in batches) == 250


def test_a_bad_expression_is_a_config_error_naming_the_entry(tmp_path: Path, spark: Any) -> None:
    """An expression over a column the table does not have stops the job before any batch (exit 2),
    naming the entry."""
    land_values(tmp_path / "landing", [b'{"id": 1}'])
    cfg = make_config(
        tmp_path, value_format="json", value_schema="id INT", partition_by=["to_date(nope) AS day"]
    )
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 2
    errors = [e for e in logs if e["event"] == "spark_job_config"]
    assert errors and "to_date(nope) AS day" in errors[0]["error"]
    assert not (Path(cfg.spark.output_dir) / "_delta_log").exists()


def test_an_iceberg_table_partitions_by_hidden_transforms(tmp_path: Path, spark: Any) -> None:
    """`days(timestamp)` and `bucket(4, offset)` make the Iceberg table's partition spec (no extra
    columns); every Iceberg reader counts each record once."""
    from pyiceberg.table import StaticTable

    pub = Publisher(LocalStore(tmp_path / "landing"))
    pub.store.open()
    expected = []
    for day in range(3):
        values = [b"v%d" % i for i in range(20)]
        ts = np.full(20, T0 + day * DAY_MS, dtype=np.int64)
        raw = fmt.encode_batch(values, timestamps=ts, base_offset=day * 20)
        batch = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
        pub.publish("events", 0, batch, pub.store.head("events", 0).last_offset)
        expected += [("events", 0, day * 20 + i) for i in range(20)]
    cfg = make_config(
        tmp_path, table_format="iceberg", partition_by=["topic", "days(timestamp)", "bucket(4, offset)"]
    )
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    table = StaticTable.from_metadata(str(out))
    spec = [(f.name, str(f.transform)) for f in table.spec().fields]
    assert spec == [("topic", "identity"), ("timestamp_day", "day"), ("offset_bucket", "bucket[4]")]
    assert "timestamp_day" not in table.schema().column_names
    for reader, keys in every_iceberg_reader_keys(out).items():
        assert offsets(keys) == sorted(expected), reader
