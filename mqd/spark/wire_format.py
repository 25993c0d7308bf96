"""The schema registry's wire format, as Spark expressions and pure helpers.

A record written by a registry-aware serializer (Confluent's, Apicurio's in its Confluent mode,
Karapace's, Redpanda's) is ``0x00``, the writer schema's id as 4 bytes big-endian, then the payload
(Avro binary; JSON text for JSON Schema). Anything else, a shorter value or another first byte, is
not in the wire format: such a record is dead-lettered, never guessed at.
"""

from __future__ import annotations

import json
from typing import Any

MAGIC = 0
HEADER_BYTES = 5


def schema_id(col: Any) -> Any:
    """The writer schema id of a wire-format value, null for any other value (or a null one)."""
    from pyspark.sql import functions as F

    ok = (F.length(col) >= HEADER_BYTES) & (F.substring(col, 1, 1) == F.lit(bytes([MAGIC])))
    # the 4 bytes as an unsigned big-endian number; ids are below 2**31 in every registry
    as_int = F.conv(F.hex(F.substring(col, 2, 4)), 16, 10).cast("long")
    return F.when(ok, as_int)


def payload(col: Any) -> Any:
    """What follows the 5-byte header."""
    from pyspark.sql import functions as F

    return F.substring(col, HEADER_BYTES + 1, 2**31 - 1)


def header(schema_id: int) -> bytes:
    """The 5 bytes a serializer puts before a payload written with ``schema_id``."""
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big")


def avro_null_record(schema_text: str) -> bytes | None:
    """The Avro encoding of a record of ``schema_text`` whose every field is null, or None when it has
    none (a field that is not a union with ``"null"``, or not a record). Spark's ``from_avro`` in
    PERMISSIVE mode answers a payload it cannot decode with a struct of nulls; only a payload equal
    to this encoding may legitimately decode so."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    out = bytearray()
    for field in schema.get("fields") or []:
        t = field.get("type") if isinstance(field, dict) else None
        if not isinstance(t, list) or "null" not in t:
            return None
        out += _varint(t.index("null"))
    return bytes(out)


def _varint(n: int) -> bytes:
    """Avro's zig-zag varint of a non-negative int (a union's branch index)."""
    z = n << 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


__all__ = ["HEADER_BYTES", "MAGIC", "avro_null_record", "header", "payload", "schema_id"]
