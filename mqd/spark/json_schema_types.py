"""A JSON Schema as the Spark type ``from_json`` parses its documents into (value_format json_schema).

Pure: the schema's JSON in, pyspark's type classes out. What maps to what:

- ``object`` with ``properties``: a struct of them, in their order, every field nullable (JSON
  Schema's ``required`` is the producer's contract, not the table's: a later version may drop it);
  an ``object`` with only ``additionalProperties`` of a schema: a map of string to that type;
- ``string`` (any ``format``, ``enum`` of strings): string; ``integer``: bigint; ``number``:
  double; ``boolean``: boolean; ``array``: an array of ``items``' type;
- a type list or ``anyOf``/``oneOf`` of one type and ``null``: that type;
- ``$ref`` to ``#/definitions/...``, ``#/$defs/...`` or a referenced schema by its registered name:
  the type it names (a cycle is refused: a table column cannot be recursive);
- anything else (an untyped schema, ``anyOf`` of several types, ``{}``): string, which ``from_json``
  fills with the value's JSON text, so nothing is lost.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)


class JsonSchemaError(ValueError):
    """A JSON Schema that cannot be a table's type (not JSON, a recursive reference, an unknown
    reference)."""


_SCALARS: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


def spark_type(schema_text: str, references: Mapping[str, str] | None = None) -> DataType:
    """The Spark type of documents valid under ``schema_text``; ``references``: registered name ->
    schema text of the schemas it refers to (the registry's references)."""
    try:
        root = json.loads(schema_text)
    except ValueError as exc:
        raise JsonSchemaError(f"not JSON: {exc}") from None
    refs = {name: _load(name, text) for name, text in (references or {}).items()}
    return _type(root, root, refs, ())


def _load(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JsonSchemaError(f"referenced schema {name!r} is not JSON: {exc}") from None


def _type(node: Any, root: Any, refs: dict[str, Any], seen: tuple[str, ...]) -> DataType:
    if node is True or not isinstance(node, dict):
        return StringType()
    if "$ref" in node:
        ref = str(node["$ref"])
        if ref in seen:
            raise JsonSchemaError(f"recursive $ref {ref!r}: a table column cannot nest without end")
        target, base = _resolve(ref, root, refs)
        return _type(target, base, refs, (*seen, ref))
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            branches = [b for b in node[key] if not (isinstance(b, dict) and b.get("type") == "null")]
            if len(branches) == 1:
                return _type(branches[0], root, refs, seen)
            return StringType()
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind is None and "properties" in node:
        kind = "object"
    if kind is None and "enum" in node and all(isinstance(v, str) for v in node["enum"]):
        kind = "string"
    if kind in _SCALARS:
        return _SCALARS[str(kind)]
    if kind == "array":
        items = node.get("items")
        return ArrayType(_type(items, root, refs, seen) if isinstance(items, dict) else StringType(), True)
    if kind == "object":
        props = node.get("properties")
        if isinstance(props, dict) and props:
            return StructType(
                [StructField(str(n), _type(p, root, refs, seen), True) for n, p in props.items()]
            )
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return MapType(StringType(), _type(extra, root, refs, seen), True)
    return StringType()


def _resolve(ref: str, root: Any, refs: dict[str, Any]) -> tuple[Any, Any]:
    """The schema ``ref`` names and the document it lives in (its own ``#/...`` refs resolve there)."""
    doc, _, pointer = ref.partition("#")
    base = root
    if doc:
        if doc not in refs:
            raise JsonSchemaError(f"$ref {ref!r}: no registered reference named {doc!r}")
        base = refs[doc]
    node = base
    for part in [p for p in pointer.split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise JsonSchemaError(f"$ref {ref!r} names nothing in its schema")
        node = node[part]
    return node, base


__all__ = ["JsonSchemaError", "spark_type"]
