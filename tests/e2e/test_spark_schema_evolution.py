"""A field added to value_schema becomes a column of the existing Delta table at the next start: the
rows before read it as null (they keep it in `_extra`), the rows after carry it; every reader agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import numpy as np
import pyarrow as pa
import pytest
from support.delta import T0, land_values, make_config
from support.table_readers import every_reader_keys, offsets

from mqd.landing import LocalStore, Publisher
from mqd.spark import job
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark


def test_a_field_added_to_the_schema_appears_as_a_column(tmp_path: Path, spark: Any) -> None:
    """Ten records with `country` land while the DDL names only `id` (country kept in `_extra`);
    the DDL gains `country STRING`, ten more land: the table has the column, null in the first ten
    rows, set in the next ten, for delta-rs, Polars and DuckDB."""
    values = [json.dumps({"id": i, "country": "se"}).encode() for i in range(20)]
    land_values(tmp_path / "landing", values[:10])
    assert job.run(make_config(tmp_path, value_format="json", value_schema="id INT"), once=True) == 0

    pub = Publisher(LocalStore(tmp_path / "landing"))
    pub.store.open()
    raw = fmt.encode_batch(values[10:], timestamps=np.full(10, T0, dtype=np.int64), base_offset=10)
    pub.publish("events", 0, pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])]), 9)
    cfg = make_config(tmp_path, value_format="json", value_schema="id INT, country STRING")
    assert job.run(cfg, once=True) == 0

    out = Path(cfg.spark.output_dir)
    for reader, keys in every_reader_keys(out).items():
        assert offsets(keys) == [("events", 0, i) for i in range(20)], reader
    rows = sorted(
        deltalake.DeltaTable(str(out)).to_pyarrow_table(columns=["offset", "country", "_extra"]).to_pylist(),
        key=lambda r: r["offset"],
    )
    assert [r["country"] for r in rows] == [None] * 10 + ["se"] * 10
    assert [json.loads(r["_extra"]) if r["_extra"] else None for r in rows] == [{"country": "se"}] * 10 + [
        None
    ] * 10
