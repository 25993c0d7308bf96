"""How a typed table's columns follow its records' writer schemas (value_format avro, json_schema).

The table's type is the truth: read from the table at start, then grown batch by batch. Each writer
schema (one registry schema id) is merged into it in id order, field by field, by name:

- a field the table lacks is added (a new column, or a new field of a nested struct), nullable;
- a field the writer lacks reads as null (a removed or not yet added field);
- a field both have must fit the table's type as it is: the same type, or one Avro's resolution
  promotes to it (int to long, float or double; long to float or double; float to double; string
  and bytes both ways). An existing column is never changed (a Delta or Iceberg table cannot
  narrow or re-type a column in place), so a writer whose field is wider than the table's column
  (long into int) cannot be reconciled: its records go to the dead-letter table with the field's
  path and both types (:class:`Misfit`).

Structs merge recursively, arrays by their element, maps by their value type (keys must be equal).
Pure: pyspark's type classes only, no JVM; :func:`conform` builds the Spark expression that turns a
record decoded with its writer schema into the table's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

# writer type -> the table types it is read as without loss (Avro's promotion rules)
_PROMOTES: dict[type[DataType], tuple[type[DataType], ...]] = {
    IntegerType: (LongType, FloatType, DoubleType),
    LongType: (FloatType, DoubleType),
    FloatType: (DoubleType,),
    StringType: (BinaryType,),
    BinaryType: (StringType,),
}


@dataclass(frozen=True, slots=True)
class Misfit(Exception):
    """A writer schema's field that the table's type cannot take."""

    path: str
    writer: str
    table: str

    def __str__(self) -> str:
        return f"field {self.path} is {self.writer} in the writer schema, the table's column is {self.table}"


def fits(writer: DataType, table: DataType) -> bool:
    """``writer``'s values read as ``table``'s without loss (equal, or an Avro promotion)."""
    return (type(writer) is type(table) and writer == table) or type(table) in _PROMOTES.get(type(writer), ())


def merge(table: StructType, writer: StructType, path: str = "") -> StructType:
    """``table`` grown by ``writer``'s fields it lacks; raises :class:`Misfit` when a field both have
    cannot be reconciled (``table`` unchanged then)."""
    by_name = {f.name: f for f in writer.fields}
    fields = []
    for f in table.fields:
        w = by_name.pop(f.name, None)
        fields.append(
            f if w is None else StructField(f.name, _merge_type(f.dataType, w.dataType, path + f.name), True)
        )
    fields += [StructField(w.name, _nullable(w.dataType), True) for w in writer.fields if w.name in by_name]
    return StructType(fields)


def _merge_type(table: DataType, writer: DataType, path: str) -> DataType:
    if isinstance(table, StructType) and isinstance(writer, StructType):
        return merge(table, writer, path + ".")
    if isinstance(table, ArrayType) and isinstance(writer, ArrayType):
        return ArrayType(_merge_type(table.elementType, writer.elementType, path + "[]"), True)
    if isinstance(table, MapType) and isinstance(writer, MapType) and table.keyType == writer.keyType:
        return MapType(table.keyType, _merge_type(table.valueType, writer.valueType, path + "{}"), True)
    if _shape_equal(table, writer) or fits(writer, table):
        return table
    raise Misfit(path, writer.simpleString(), table.simpleString())


def _shape_equal(a: DataType, b: DataType) -> bool:
    """Equal ignoring nullability (a writer's required field fits the table's nullable one)."""
    return _nullable(a) == _nullable(b)


def _nullable(t: DataType) -> DataType:
    """``t`` with every nested field, element and value nullable: table columns always are (a
    later writer may lack the field)."""
    if isinstance(t, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in t.fields])
    if isinstance(t, ArrayType):
        return ArrayType(_nullable(t.elementType), True)
    if isinstance(t, MapType):
        return MapType(t.keyType, _nullable(t.valueType), True)
    return t


def conform(col: Any, writer: DataType, table: DataType) -> Any:
    """The Spark expression turning ``col`` (of the writer's type) into ``table``'s type: fields by
    name, missing ones null, promotions cast. ``merge`` must have accepted the pair."""
    from pyspark.sql import functions as F

    if _shape_equal(writer, table):
        return col
    if isinstance(table, StructType) and isinstance(writer, StructType):
        have = {f.name: f.dataType for f in writer.fields}
        parts = [
            (
                conform(col.getField(f.name), have[f.name], f.dataType)
                if f.name in have
                else F.lit(None).cast(f.dataType)
            ).alias(f.name)
            for f in table.fields
        ]
        return F.when(col.isNull(), F.lit(None).cast(table)).otherwise(F.struct(*parts))
    if isinstance(table, ArrayType) and isinstance(writer, ArrayType):
        return F.transform(col, lambda x: conform(x, writer.elementType, table.elementType))
    if isinstance(table, MapType) and isinstance(writer, MapType):
        return F.transform_values(col, lambda _k, v: conform(v, writer.valueType, table.valueType))
    return col.cast(table)


__all__ = ["Misfit", "conform", "fits", "merge"]
