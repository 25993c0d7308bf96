"""The pure parts of typed records: how writer schemas merge into the table's type
(mqd/spark/schema_evolution.py), the registry wire format's all-null record
(mqd/spark/wire_format.py), Avro references inlined into one schema (typed_records) and JSON Schemas
as Spark types (json_schema_types)."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from mqd.spark.json_schema_types import JsonSchemaError, spark_type
from mqd.spark.schema_evolution import Misfit, merge
from mqd.spark.typed_records import inline_avro_references
from mqd.spark.wire_format import avro_null_record, header


def _struct(**fields: DataType) -> StructType:
    return StructType([StructField(n, t, True) for n, t in fields.items()])


def test_a_new_field_is_a_new_column_and_a_missing_one_stays() -> None:
    """v2 adds `score`: the table gains it, last; v1's `name` that v3 drops stays a column."""
    v1 = _struct(id=LongType(), name=StringType())
    v2 = _struct(id=LongType(), name=StringType(), score=DoubleType())
    v3 = _struct(id=LongType(), score=DoubleType())
    table = merge(merge(merge(StructType([]), v1), v2), v3)
    assert table.fieldNames() == ["id", "name", "score"]


def test_a_promoted_field_keeps_the_tables_type_and_a_wider_one_is_refused() -> None:
    """int into a long column fits (Avro's promotion); long into an int column names the field and
    both types; the table is unchanged by the refused writer."""
    table = _struct(n=LongType())
    assert merge(table, _struct(n=IntegerType())) == table
    narrow = _struct(n=IntegerType())
    with pytest.raises(Misfit) as info:
        merge(narrow, _struct(n=LongType()))
    assert str(info.value) == "field n is bigint in the writer schema, the table's column is int"


def test_nested_structs_grow_and_nested_misfits_name_their_path() -> None:
    table = _struct(a=_struct(x=LongType()), tags=ArrayType(_struct(k=StringType())))
    grown = merge(
        table,
        _struct(
            a=_struct(x=LongType(), y=StringType()), tags=ArrayType(_struct(k=StringType(), v=LongType()))
        ),
    )
    assert grown["a"].dataType.fieldNames() == ["x", "y"]  # type: ignore[attr-defined]
    assert grown["tags"].dataType.elementType.fieldNames() == ["k", "v"]  # type: ignore[attr-defined]
    with pytest.raises(Misfit) as info:
        merge(table, _struct(a=_struct(x=StringType())))
    assert info.value.path == "a.x"
    with pytest.raises(Misfit):
        merge(_struct(m=MapType(StringType(), LongType())), _struct(m=MapType(LongType(), LongType())))


_PRIMITIVES = [IntegerType(), LongType(), DoubleType(), StringType(), BinaryType()]
_types = st.recursive(
    st.sampled_from(_PRIMITIVES),
    lambda inner: st.one_of(
        st.builds(lambda t: ArrayType(t, True), inner),
        st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3).map(lambda d: _struct(**d)),
    ),
    max_leaves=6,
)
_structs = st.dictionaries(st.sampled_from("abcdef"), _types, max_size=4).map(lambda d: _struct(**d))


@given(st.lists(_structs, min_size=1, max_size=5))
def test_merging_never_loses_a_column_nor_retypes_one(writers: list[StructType]) -> None:
    """Whatever the writers, in order: every column the table had keeps its name and position, a
    column of a primitive type keeps that type exactly (a table cannot re-type a column in place;
    a struct may only gain fields), and every accepted writer's fields are in the table."""
    table = StructType([])
    for w in writers:
        try:
            grown = merge(table, w)
        except Misfit:
            continue
        assert grown.fieldNames()[: len(table.fields)] == table.fieldNames()
        for old in table.fields:
            if not isinstance(old.dataType, (StructType, ArrayType, MapType)):
                assert grown[old.name].dataType == old.dataType
        assert set(w.fieldNames()) <= set(grown.fieldNames())
        table = grown


@pytest.mark.parametrize(
    "fields",
    [
        [{"name": "a", "type": ["null", "long"]}],
        [{"name": "a", "type": ["long", "null"]}, {"name": "b", "type": ["null", "string"]}],
    ],
)
def test_the_all_null_record_is_what_an_avro_writer_writes(fields: list[dict[str, object]]) -> None:
    """The bytes Spark's PERMISSIVE struct-of-nulls may legitimately stand for are fastavro's own
    encoding of the all-null record (so only a payload equal to them is not a decode failure)."""
    schema = {"type": "record", "name": "R", "fields": fields}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), {f["name"]: None for f in fields})
    assert avro_null_record(json.dumps(schema)) == out.getvalue()


def test_a_record_with_a_required_field_has_no_all_null_encoding() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    assert avro_null_record(json.dumps(schema)) is None
    assert avro_null_record('"string"') is None
    assert header(1) == b"\x00\x00\x00\x00\x01" and header(2**31 - 1) == b"\x00\x7f\xff\xff\xff"


def test_references_are_defined_where_first_named_and_named_after() -> None:
    """A schema naming `acme.Address` twice, registered with a reference to it: the result parses
    as one schema (fastavro's parser, as strict as Avro's Java one on redefinitions) and a record
    written with it reads back."""
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "acme",
        "fields": [{"name": "city", "type": "string"}],
    }
    main = {
        "type": "record",
        "name": "Order",
        "namespace": "acme",
        "fields": [{"name": "ship", "type": "acme.Address"}, {"name": "bill", "type": "acme.Address"}],
    }
    text = inline_avro_references(json.dumps(main), [("acme.Address", json.dumps(address))])
    parsed = fastavro.parse_schema(json.loads(text))
    out = io.BytesIO()
    rec = {"ship": {"city": "a"}, "bill": {"city": "b"}}
    fastavro.schemaless_writer(out, parsed, rec)
    out.seek(0)
    assert fastavro.schemaless_reader(out, parsed, None) == rec


def test_json_schema_objects_scalars_arrays_and_nullable_unions() -> None:
    """The types a JSON Schema's documents parse into: properties in order, all nullable."""
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": ["string", "null"]},
            "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"enum": ["a", "b"]},
            "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
            "any": {},
        },
        "required": ["id"],
    }
    t = spark_type(json.dumps(schema))
    assert t == _struct(
        id=LongType(),
        name=StringType(),
        score=DoubleType(),
        tags=ArrayType(StringType(), True),
        kind=StringType(),
        attrs=MapType(StringType(), LongType(), True),
        any=StringType(),
    )


def test_json_schema_refs_local_and_registered_and_cycles_refused() -> None:
    """``#/$defs`` and ``#/definitions`` resolve in their document; a registered reference by its
    name; a recursive reference is refused (a column cannot nest without end)."""
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "money.json"}},
        "$defs": {"A": {"type": "object", "properties": {"x": {"type": "boolean"}}}},
    }
    money = {
        "type": "object",
        "properties": {"units": {"$ref": "#/definitions/U"}},
        "definitions": {"U": {"type": "integer"}},
    }
    t = spark_type(json.dumps(schema), {"money.json": json.dumps(money)})
    assert t == _struct(a=_struct(x=BooleanType()), b=_struct(units=LongType()))
    loop = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    with pytest.raises(JsonSchemaError, match="recursive"):
        spark_type(json.dumps(loop))
    with pytest.raises(JsonSchemaError, match="no registered reference"):
        spark_type(json.dumps({"$ref": "other.json"}))
