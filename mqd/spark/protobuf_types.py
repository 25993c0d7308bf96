"""Protobuf in the schema registry's wire format: the pure parts (no JVM, no protoc).

A Protobuf record is ``0x00``, the schema id (4 bytes), then the **message indexes**, then the
message. The indexes say which message of the writer schema's .proto file the record is: a path
through the file's messages (``[1]`` the second top-level message, ``[0, 2]`` the third message
nested in the first), written as a zig-zag varint count followed by that many zig-zag varints; the
single byte ``0x00`` (count 0) is the shorthand for ``[0]``, the file's first message. A path is
written here as text, ``"0"``, ``"1"``, ``"0.2"`` (the decoder's JVM side gives the same text).

The Spark type of each message comes from the decoder's describe (mqd/spark/jvm/ProtobufDecode.java,
which also turns each parsed message into a row of that type, so the two never disagree): Spark's
JSON type text per message path, read here by :func:`messages`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_INDEXES = 64  # as the decoder: a deeper path is not a real payload


def zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def unzigzag(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_message_indexes(indexes: Sequence[int]) -> bytes:
    """The message indexes as a serializer writes them: ``[0]`` as the one byte ``0x00``."""
    if any(i < 0 for i in indexes) or not indexes:
        raise ValueError(f"message indexes must be a non-empty path of non-negative ints: {list(indexes)}")
    if list(indexes) == [0]:
        return b"\x00"
    return b"".join(_varint(zigzag(n)) for n in [len(indexes), *indexes])


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(data):
            raise ValueError("message indexes: the payload ends inside a varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 35:  # an int32 varint is at most 5 bytes
            raise ValueError("message indexes: a varint longer than 5 bytes")


def decode_message_indexes(data: bytes) -> tuple[list[int], int]:
    """(the path, the bytes it took) at the start of ``data`` (the payload after the 5-byte
    header); ValueError when malformed (a negative count or index, more than MAX_INDEXES, cut)."""
    z, pos = _read_varint(data, 0)
    count = unzigzag(z)
    if count == 0:
        return [0], pos
    if count < 0 or count > MAX_INDEXES:
        raise ValueError(f"message indexes: count {count}")
    out = []
    for _ in range(count):
        z, pos = _read_varint(data, pos)
        n = unzigzag(z)
        if n < 0:
            raise ValueError(f"message indexes: negative index {n}")
        out.append(n)
    return out, pos


_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def serialized_file(text: str, name: str) -> bytes | None:
    """A schema registered as a base64 FileDescriptorProto (what confluent-kafka's Python
    ProtobufSerializer registers; Confluent's registry answers it back as .proto text, Apicurio
    verbatim) as that FileDescriptorProto's bytes, its file name replaced by ``name`` (the name its
    importers or the decoder know it by); None for .proto text, which never is bare base64."""
    compact = text.strip()
    if not compact or len(compact) % 4 or not _BASE64.fullmatch(compact):
        return None
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        return None
    # a singular field given twice: the last one counts, so this name replaces the file's own
    return data + b"\x0a" + _varint(len(name.encode())) + name.encode()


def file_descriptor_set(files: Sequence[bytes]) -> bytes:
    """A FileDescriptorSet of FileDescriptorProtos' bytes (field 1, repeated)."""
    return b"".join(b"\x0a" + _varint(len(f)) + f for f in files)


def path_text(indexes: Sequence[int]) -> str:
    return ".".join(str(i) for i in indexes)


def wire_record(schema_id: int, message: bytes, indexes: Sequence[int] = (0,)) -> bytes:
    """A record as a Protobuf serializer writes it: header, message indexes, message bytes."""
    from mqd.spark.wire_format import header

    return header(schema_id) + encode_message_indexes(indexes) + message


@dataclass(frozen=True, slots=True)
class MessageType:
    """One message of a writer schema's file: its path, full name, and Spark type (a StructType),
    or why it has none (a recursive message)."""

    path: str
    name: str
    spark_type: Any
    error: str | None = None


def messages(described: Mapping[str, Any]) -> dict[str, MessageType]:
    """The decoder's describe answer (``{"messages": [{"path", "name", "type", "error"}]}``) as
    MessageTypes by path, each type a pyspark StructType."""
    from pyspark.sql.types import StructType

    if "error" in described and "messages" not in described:
        raise ValueError(str(described["error"]))
    out = {}
    for m in described["messages"]:
        t = StructType.fromJson(m["type"]) if m.get("type") is not None else None
        out[m["path"]] = MessageType(m["path"], m["name"], t, m.get("error"))
    return out


__all__ = [
    "MAX_INDEXES",
    "MessageType",
    "decode_message_indexes",
    "encode_message_indexes",
    "file_descriptor_set",
    "messages",
    "path_text",
    "serialized_file",
    "unzigzag",
    "wire_record",
    "zigzag",
]
