"""The landing schema, defined once: the Arrow schema of a landed file and the Spark DDL derived from it.

A landed Parquet file holds the record columns of a decoded batch (``mqd.records.RECORD_SCHEMA``)
after ``topic``, ``partition`` and ``incarnation`` (the log incarnation the offsets belong to: a
record's identity is (topic, partition, incarnation, offset); null in files landed before
incarnations existed, which Spark reads as null since the column is missing there). Spark's
file source adds the Hive partition columns of the folder names (``dt=YYYY-MM-DD/hour=HH``).
The Spark job reads with an explicit schema (never inferred), so its DDL is generated here from the
Arrow schema (and the landing table's Delta schema too): one place to change, and a unit test
(tests/unit/landing/test_landing_schema.py) that fails when they drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from mqd.records import RECORD_SCHEMA

# topic and incarnation are dictionary-encoded: one string per file, not one per record
LANDING_SCHEMA = pa.schema(
    [
        ("topic", pa.dictionary(pa.int32(), pa.string())),
        ("partition", pa.int32()),
        ("incarnation", pa.dictionary(pa.int32(), pa.string())),
        *RECORD_SCHEMA,
    ]
)

# the Hive partition columns Spark reads from the folder names (layout.hour_dir), after the file's
PARTITION_COLUMNS: tuple[tuple[str, str], ...] = (("dt", "STRING"), ("hour", "INT"))


# the landing's scalar Arrow types: (test, Spark SQL name, the name in Spark's JSON form of a
# schema, which a Delta table's schemaString holds)
_SCALARS: tuple[tuple[Callable[[pa.DataType], bool], str, str], ...] = (
    (pa.types.is_string, "STRING", "string"),
    (pa.types.is_binary, "BINARY", "binary"),
    (pa.types.is_int32, "INT", "integer"),
    (pa.types.is_int64, "BIGINT", "long"),
)


def spark_type(t: pa.DataType) -> str:
    """The Spark SQL type Spark's Parquet reader gives an Arrow type mqd writes; ValueError for a
    type the landing does not use (a new column needs its mapping here, not a guess)."""
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    for test, sql, _ in _SCALARS:
        if test(t):
            return sql
    if pa.types.is_timestamp(t):
        # Parquet stores UTC instants; Spark's TIMESTAMP is an instant too
        return "TIMESTAMP"
    if pa.types.is_list(t):
        return f"ARRAY<{spark_type(t.value_type)}>"
    if pa.types.is_struct(t):
        fields = ", ".join(f"{t.field(i).name}: {spark_type(t.field(i).type)}" for i in range(t.num_fields))
        return f"STRUCT<{fields}>"
    raise ValueError(f"no Spark type for the landing's Arrow type {t}")


def spark_json_type(t: pa.DataType) -> str | dict[str, Any]:
    """The same type in Spark's JSON form, as a Delta table's schema holds it (what delta-rs writes
    for it); ValueError for a type the landing does not use."""
    if pa.types.is_dictionary(t):
        return spark_json_type(t.value_type)
    for test, _, name in _SCALARS:
        if test(t):
            return name
    if pa.types.is_timestamp(t) and t.tz is not None:
        return "timestamp"  # an instant; a zoneless one is Delta's timestamp_ntz, a writer-7 feature
    if pa.types.is_list(t):
        element = spark_json_type(t.value_type)
        return {"type": "array", "elementType": element, "containsNull": t.value_field.nullable}
    if pa.types.is_struct(t):
        return spark_json_struct([t.field(i) for i in range(t.num_fields)])
    raise ValueError(f"no Delta type for the landing's Arrow type {t}")


def spark_json_struct(fields: Iterable[pa.Field]) -> dict[str, Any]:
    """A struct of Arrow fields in Spark's JSON form (a Delta table's schemaString is one)."""
    return {
        "type": "struct",
        "fields": [
            {"name": f.name, "type": spark_json_type(f.type), "nullable": f.nullable, "metadata": {}}
            for f in fields
        ],
    }


def landing_columns() -> list[str]:
    """Column names as Spark sees a landed file: the file's columns, then the partition columns."""
    return [*LANDING_SCHEMA.names, *(name for name, _ in PARTITION_COLUMNS)]


def landing_ddl() -> str:
    """The Spark DDL of the landing as the streaming source reads it."""
    cols = [f"{f.name} {spark_type(f.type)}" for f in LANDING_SCHEMA]
    cols += [f"{name} {sql}" for name, sql in PARTITION_COLUMNS]
    return ", ".join(cols)
