"""The record as every part of mqd sees it once decoded: the Arrow schema of a decoded batch, the
same whichever source it came from (the mqd broker's wire format, Kafka's RecordBatch v2), which the
landing writes with topic and partition added (landing/schema.py).

Neutral ground (issue 32): the landing and the Kafka source name the record here, not in the mqd
broker's wire module (mqd.wire.format), whose own decoder imports them from here too. Imports
pyarrow: keep it off the daemon's start path (import it where records are decoded or written).
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["HEADERS_TYPE", "RECORD_SCHEMA"]

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
