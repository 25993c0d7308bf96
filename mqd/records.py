"""The record as every part of mqd sees it once decoded: the Arrow schema of a decoded batch, the
same whichever source it came from (the mqd broker's wire format, Kafka's RecordBatch v2), which the
landing writes with topic and partition added (landing/schema.py).

Neutral ground (issue 32): the landing and the Kafka source name the record here, not in the mqd
broker's wire module (mqd.wire.format), whose own decoder imports them from here too. Imports
pyarrow: keep it off the daemon's start path (import it where records are decoded or written).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import numpy as np

__all__ = ["HEADERS_TYPE", "RECORD_SCHEMA", "fixed_width_array"]

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORD_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS_TYPE),
    ]
)


def fixed_width_array(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """A contiguous numpy array of ``type``'s width as an Arrow array over its buffer, no nulls.
    Not ``pa.array(values)``: that looks for a numpy masked array first, and the look imports
    numpy.ma (~15 ms of a burst's CPU) the first time a column is built."""
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])
