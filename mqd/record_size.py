"""The one record-size limit, checked end to end: producer, broker, landing.

A record's size is its payload: key + value + every header's key and value, in bytes (what a
Spark row holds besides a few fixed-size columns). The broker refuses a produce holding a larger
record (413 ``record_too_large``), the producer refuses it before sending, and the daemon parks
the partition on one instead of landing a file the Spark job cannot read at its default memory.

``DEFAULT_MAX_RECORD_BYTES`` (defined in config.py, which must stay light to import) is
measured, not guessed. ``mqd spark --once`` (local mode, 2 cores) on a landing file holding one
large value among small records: at the default spark.driver_memory = "1g" a 60 MiB value was
read and a 96 MiB one ended in OutOfMemoryError; at 512m, 32 MiB was read and 60 MiB failed (the
issue's crash). A landed file holds up to landing.max_bytes (32 MiB) plus one record, so with
16 MiB records a file stays under 48 MiB, inside what the default driver read, and a 512m driver
still reads a file of one such record.

Vectorised: per-record sizes come from the Arrow offsets buffers (numpy), never a Python object
per record, and a batch no longer than the limit is not looked into at all (its records cannot be
larger than the batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqd.config import DEFAULT_MAX_RECORD_BYTES
from mqd.errors import MqdError
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")
    pc = lazy_import("pyarrow.compute")

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "RecordTooLarge",
    "first_too_large",
    "oversize",
    "record_sizes",
]

LIMIT_KEYS = "broker limits.max_record_bytes, daemon landing.max_record_bytes, Producer(max_record_bytes=)"


class RecordTooLarge(MqdError, ValueError):
    """A record is larger than the record-size limit. Not retriable: the record must change.
    ``what`` names the record (``record 3 of the request``, ``t/0 offset 1234``)."""

    retriable = False

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size} bytes (key + value + headers), above the record-size limit of "
            f"{limit} bytes ({LIMIT_KEYS}): the Spark job reads records up to that size at its "
            "default memory"
        )
        self.what = what
        self.size = size
        self.limit = limit


def _lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of each binary/string value (0 for null), as int64."""
    return np.asarray(pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def record_sizes(records: pa.RecordBatch) -> np.ndarray:
    """Payload bytes (key + value + header keys and values) of each record of a decoded batch."""
    sizes: np.ndarray = _lengths(records.column("key")) + _lengths(records.column("value"))
    headers = records.column("headers")
    if len(headers.values):
        entries = headers.values
        per_header = _lengths(entries.field("key")) + _lengths(entries.field("value"))
        cum = np.concatenate(([0], np.cumsum(per_header)))
        bounds = np.asarray(headers.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        sizes += cum[bounds[1:]] - cum[bounds[:-1]]
    return sizes


def first_too_large(records: pa.RecordBatch, limit: int) -> tuple[int, int] | None:
    """(row, size) of the first record of ``records`` larger than ``limit``, or None."""
    sizes = record_sizes(records)
    over = np.flatnonzero(sizes > limit)
    if not len(over):
        return None
    row = int(over[0])
    return row, int(sizes[row])


def oversize(records: pa.RecordBatch, nbytes: int, limit: int) -> tuple[int, int] | None:
    """(offset, size) of the first record above ``limit`` in a fetched batch of ``nbytes`` wire
    bytes, or None; a batch within the limit is not looked into."""
    if nbytes <= limit:
        return None
    found = first_too_large(records, limit)
    if found is None:
        return None
    return int(records.column("offset")[found[0]].as_py()), found[1]
