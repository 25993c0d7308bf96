"""Typed records written with Protobuf (``value_format = "protobuf"``): the registry's wire format
with message indexes, each id's .proto compiled by a real protoc (its imports by the names they
are registered under), each record parsed in Spark's JVM by mqd's decoder into typed columns that
follow the subject's versions; the message a record's indexes select is the one decoded; a payload
that does not parse, an Avro schema's id, a recursive message and a .proto protoc refuses are dead
letters with their class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deltalake
import pytest
from support.protobuf_wire import f64, ld, vint
from support.typed import land_values, register, registry, typed_config

from mqd.config import REGISTRY_FORMATS
from mqd.spark import job
from mqd.spark.protobuf_types import wire_record
from mqd.testing.schema_registry import SchemaRegistry

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        "protobuf" not in REGISTRY_FORMATS, reason="mqd/config.py does not accept protobuf yet"
    ),
]
__all__ = ["registry"]  # the module's fixture

T_2026 = 1_767_225_600  # 2026-01-01T00:00:00Z in seconds

ORDER_V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  int64 id = 1;
  string name = 2;
  Item item = 3;
  repeated string tags = 4;
  map<string, int32> counts = 5;
  google.protobuf.Timestamp at = 6;
  Kind kind = 7;
  message Item { string sku = 1; int32 qty = 2; }
  enum Kind { KIND_UNSPECIFIED = 0; RETAIL = 1; WHOLESALE = 2; }
}

message Note {
  string text = 1;
}
"""
ORDER_V2 = ORDER_V1.replace("  Kind kind = 7;\n", "  Kind kind = 7;\n  double score = 8;\n")


def _order(n: int, *, score: float | None = None) -> bytes:
    body = vint(1, n) + ld(2, f"n{n}") + ld(3, ld(1, f"sku{n}") + vint(2, n + 1))
    body += ld(4, "a") + ld(4, "b") + ld(5, ld(1, "x") + vint(2, n))
    body += ld(6, vint(1, T_2026 + n)) + vint(7, 1 + n % 2)
    if score is not None:
        body += f64(8, score)
    return body


def _rows(path: Path) -> list[dict[str, Any]]:
    return sorted(deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["offset"])


def test_protobuf_versions_messages_and_dead_letters(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """v1 and v2 (adds score) records land in one table: score null for v1 rows; a nested message,
    a repeated field, a map, a Timestamp and an enum are typed columns; a record whose message
    indexes are [1] is the file's second message (its field a column of its own, the others null).
    A payload that does not parse is decode_failed, an Avro id under protobuf unsupported_schema,
    and so are a recursive message (with its path) and a .proto protoc refuses (with protoc's
    message). Table + dead letters are exactly the landed offsets."""
    i1 = register(registry, "orders-pb-value", ORDER_V1, "PROTOBUF")
    i2 = register(registry, "orders-pb-value", ORDER_V2, "PROTOBUF")
    avro_id = register(registry, "orders-pb-avro-value", json.dumps("string"))
    recursive = register(
        registry, "orders-pb-tree-value", 'syntax = "proto3";\nmessage Tree { Tree left = 1; }\n', "PROTOBUF"
    )
    cfg = typed_config(tmp_path, registry.url, value_format="protobuf")
    good = [wire_record(i1, _order(n)) for n in range(3)]
    good += [wire_record(i2, _order(3, score=2.5))]
    good += [wire_record(i2, ld(1, "hello"), indexes=[1])]
    bad = {
        "does not parse": wire_record(i1, b"\x0f\x01"),  # wire type 7 does not exist
        "avro": wire_record(avro_id, b"\x02s"),
        "recursive": wire_record(recursive, vint(1, 1)),
    }
    offsets = land_values(Path(cfg.landing.dir), good + list(bad.values()))
    assert job.run(cfg, once=True) == 0

    rows = _rows(Path(cfg.spark.output_dir))
    assert [(r["id"], r["name"], r["score"], r["text"]) for r in rows] == [
        (0, "n0", None, None),
        (1, "n1", None, None),
        (2, "n2", None, None),
        (3, "n3", 2.5, None),
        (None, None, None, "hello"),
    ]
    first = rows[1]
    assert first["item"] == {"sku": "sku1", "qty": 2}
    assert first["tags"] == ["a", "b"]
    assert dict(first["counts"]) == {"x": 1}
    assert first["at"].timestamp() == T_2026 + 1
    assert [r["kind"] for r in rows[:4]] == ["RETAIL", "WHOLESALE", "RETAIL", "WHOLESALE"]

    dead = _rows(Path(cfg.spark.quarantine_dir))
    assert [(r["error_class"], r["value"]) for r in dead] == [
        ("decode_failed", bad["does not parse"]),
        ("unsupported_schema", bad["avro"]),
        ("unsupported_schema", bad["recursive"]),
    ]
    assert "AVRO" in dead[1]["error_message"]
    assert "recursive message" in dead[2]["error_message"] and "Tree" in dead[2]["error_message"]
    assert sorted([r["offset"] for r in rows] + [r["offset"] for r in dead]) == offsets


def test_protobuf_imports_resolve_and_protoc_refusals_are_dead_letters(
    tmp_path: Path, spark: Any, registry: SchemaRegistry
) -> None:
    """An Invoice importing money/money.proto (registered as its own subject, referenced by that
    name) decodes with the imported message as a nested column; a .proto that the registry took
    but protoc refuses (an undefined type) is unsupported_schema with protoc's message."""
    money = 'syntax = "proto3";\npackage money;\nmessage Money { string currency = 1; int64 units = 2; }\n'
    invoice = (
        'syntax = "proto3";\npackage billing;\nimport "money/money.proto";\n'
        "message Invoice { string number = 1; money.Money total = 2; repeated money.Money lines = 3; }\n"
    )
    register(registry, "money-pb", money, "PROTOBUF")
    iid = registry.register(
        "invoices-pb-value", invoice, "PROTOBUF", references=[("money/money.proto", "money-pb", 1)]
    )
    # the registry takes it (Apicurio does not resolve field types), protoc does not
    refused = register(
        registry, "broken-pb-value", 'syntax = "proto3";\nmessage X { Nope y = 1; }\n', "PROTOBUF"
    )
    cfg = typed_config(tmp_path, registry.url, value_format="protobuf")
    line = ld(1, "EUR") + vint(2, 7)
    values = [wire_record(iid, ld(1, "F-1") + ld(2, ld(1, "EUR") + vint(2, 12)) + ld(3, line) + ld(3, line))]
    values.append(wire_record(refused, vint(1, 1)))
    land_values(Path(cfg.landing.dir), values)
    assert job.run(cfg, once=True) == 0
    rows = _rows(Path(cfg.spark.output_dir))
    assert [(r["number"], r["total"], r["lines"]) for r in rows] == [
        ("F-1", {"currency": "EUR", "units": 12}, [{"currency": "EUR", "units": 7}] * 2)
    ]
    dead = _rows(Path(cfg.spark.quarantine_dir))
    assert [r["error_class"] for r in dead] == ["unsupported_schema"]
    assert (
        "protoc refuses it" in dead[0]["error_message"]
        and '"Nope" is not defined' in dead[0]["error_message"]
    )
