"""Typed records written with JSON Schema (``value_format = "json_schema"``): the registry's wire
format around JSON text, parsed by the writer schema's Spark type into typed columns that follow
the subject's versions; a document that is not valid JSON for its schema, and an Avro schema id
under this format, are dead letters with their class; a $ref into the schema's own $defs is a
nested struct column."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pytest
from support.table_readers import every_reader_keys
from support.typed import land_values, register, registry, typed_config

from mqd.spark import job
from mqd.spark.job_metrics import FILE_NAME
from mqd.spark.wire_format import header
from mqd.testing.schema_registry import SchemaRegistry

pytestmark = pytest.mark.spark
__all__ = ["registry"]  # the module's fixture


def _schema(**props: Any) -> str:
    return json.dumps(
        {
            "type": "object",
            "properties": props,
            "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}}},
        }
    )


def _doc(schema_id: int, doc: Any) -> bytes:
    return header(schema_id) + json.dumps(doc).encode()


def test_json_schema_versions_land_typed_and_bad_documents_are_dead_letters(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """v1 (id, name, addr by $ref) and v2 (adds score) documents land in one table: `score` null
    for v1 rows, `addr.city` a nested column; an `id` that is not an integer, text that is not
    JSON and an Avro schema's id are dead letters (decode_failed twice, unsupported_schema) with
    their raw bytes; table + dead letters are exactly the landed offsets; every reader agrees."""
    v1 = _schema(id={"type": "integer"}, name={"type": "string"}, addr={"$ref": "#/$defs/Addr"})
    v2 = _schema(
        id={"type": "integer"},
        name={"type": "string"},
        addr={"$ref": "#/$defs/Addr"},
        score={"type": ["number", "null"]},
    )
    i1 = register(registry, "orders-js-value", v1, "JSON")
    i2 = register(registry, "orders-js-value", v2, "JSON")
    avro_id = register(registry, "orders-js-avro-value", json.dumps("string"))
    cfg = typed_config(tmp_path, registry.url, value_format="json_schema")
    good = [_doc(i1, {"id": n, "name": f"n{n}", "addr": {"city": "x"}}) for n in range(3)]
    good += [_doc(i2, {"id": 3, "name": "m", "addr": {"city": "y"}, "score": 2.5})]
    bad = {
        "decode_failed": _doc(i1, {"id": "not a number", "name": "z"}),
        "not json": header(i1) + b"{oops",
        "unsupported_schema": _doc(avro_id, "s"),
    }
    offsets = land_values(Path(cfg.landing.dir), good + list(bad.values()))
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    rows = sorted(deltalake.DeltaTable(str(out)).to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])
    assert [(r["id"], r["score"], r["addr"]["city"]) for r in rows] == [
        (0, None, "x"),
        (1, None, "x"),
        (2, None, "x"),
        (3, 2.5, "y"),
    ]
    dead = sorted(
        deltalake.DeltaTable(str(cfg.spark.quarantine_dir)).to_pyarrow_table().to_pylist(),
        key=lambda r: r["offset"],
    )
    assert [(r["error_class"], r["value"]) for r in dead] == [
        ("decode_failed", bad["decode_failed"]),
        ("decode_failed", bad["not json"]),
        ("unsupported_schema", bad["unsupported_schema"]),
    ]
    assert "not JSON" in dead[2]["error_message"] or "AVRO" in dead[2]["error_message"]
    assert sorted([r["offset"] for r in rows] + [r["offset"] for r in dead]) == offsets
    for reader, keys in every_reader_keys(out).items():
        assert [k[3] for k in keys] == offsets[:4], reader


def test_properties_the_schema_does_not_declare_are_kept_and_counted(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """A JSON Schema allows undeclared properties unless it says otherwise: a document's `seq` and
    `tags`, which the schema does not name, are kept in the row's `_extra` as JSON (values as
    sent), null for a document without any, and counted (extra_field_rows in the metrics file);
    a declared property named `_extra` takes the column `value__extra` and is not mistaken for one."""
    schema = _schema(id={"type": "integer"}, _extra={"type": "string"})
    sid = register(registry, "orders-js-extra-value", schema, "JSON")
    cfg = typed_config(tmp_path, registry.url, value_format="json_schema")
    docs = [
        {"id": 0, "_extra": "declared"},
        {"id": 1, "seq": 7, "tags": ["a", "b"]},
        {"id": 2, "seq": {"nested": True}},
    ]
    land_values(Path(cfg.landing.dir), [_doc(sid, d) for d in docs])
    assert job.run(cfg, once=True) == 0
    out = Path(cfg.spark.output_dir)
    rows = sorted(deltalake.DeltaTable(str(out)).to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])
    assert [r["value__extra"] for r in rows] == ["declared", None, None]
    extra = [json.loads(r["_extra"]) if r["_extra"] is not None else None for r in rows]
    assert extra == [None, {"seq": 7, "tags": ["a", "b"]}, {"seq": {"nested": True}}]
    metrics = (Path(cfg.spark.checkpoint_dir) / FILE_NAME).read_text()
    assert 'mqd_spark_extra_field_rows_total{query="' in metrics
    assert [
        line.split()[-1] for line in metrics.splitlines() if "extra_field_rows" in line and "{" in line
    ] == ["2"]
