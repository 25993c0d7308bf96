"""Protobuf messages written byte by byte for the typed-records tests (the wire format is small:
a tag varint of field number and wire type, then a varint or a length-prefixed body), so the tests
need no generated classes and no protobuf package."""

from __future__ import annotations

import struct


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64 is written as its two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def vint(field: int, value: int) -> bytes:
    """A varint field: int32/int64/uint/bool/enum."""
    return varint(field << 3) + varint(value)


def ld(field: int, body: bytes | str) -> bytes:
    """A length-delimited field: string, bytes, a nested message, one entry of a map."""
    data = body.encode() if isinstance(body, str) else body
    return varint(field << 3 | 2) + varint(len(data)) + data


def f64(field: int, value: float) -> bytes:
    return varint(field << 3 | 1) + struct.pack("<d", value)
