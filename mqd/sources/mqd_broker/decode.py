"""Decoding one partition's slice of an mqd fetch answer into Arrow record batches (mqd.wire.format).

Zero-copy: the record batches are views of the answer body (no Python object per record).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqd.consumer.source import Decoded, DecodedBatch
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa

    from mqd.wire import format
else:
    pa = lazy_import("pyarrow")
    format = lazy_import("mqd.wire.format")


def decode_batches(data: memoryview, offset: int, check_crc: bool) -> Decoded:
    """Batches from ``offset`` on, the first cut to start there; stops at the first bad batch and
    returns the good ones before it with the error, so one damaged batch does not hold back the
    rest."""
    batches: list[DecodedBatch] = []
    expected, pos = offset, 0
    pbuf: pa.Buffer | None = None
    try:
        while pos < len(data):
            info = format.read_header(data, pos)
            if check_crc:
                format.check_crc(data, info)
            pos += info.length
            if info.next_offset <= expected:
                continue  # wholly below the requested offset
            if info.base_offset > expected:
                raise format.BatchError(
                    f"offset gap: expected {expected}, batch starts at {info.base_offset}"
                )
            if pbuf is None:
                pbuf = pa.py_buffer(data)  # zero-copy view of the answer
            cut = expected if info.base_offset < expected else None
            # a CRC match means these are the bytes the broker validated deeply on produce
            records = format.to_arrow(pbuf, info, start_offset=cut, deep_check=not check_crc)
            batches.append(DecodedBatch(records, expected, info.next_offset, info.length))
            expected = info.next_offset
    except format.BatchError as exc:
        return Decoded(batches, str(exc))
    return Decoded(batches)
