"""Arrow batches shaped like the Spark job's output, for the Iceberg sink's tests without Spark."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def batch(first: int, n: int, *, partition: int = 0, tz: str = "UTC", **extra: list[object]) -> pa.Table:
    """``n`` records of topic ``events`` from offset ``first``, shaped like the job's output."""
    cols: dict[str, pa.Array] = {
        "topic": pa.array(["events"] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "incarnation": pa.array(["inc-1"] * n, pa.string()),
        "offset": pa.array(range(first, first + n), pa.int64()),
        "timestamp": pa.array([T0] * n, pa.timestamp("us", "UTC")).cast(pa.timestamp("us", tz)),
        "value": pa.array([b"v%d" % i for i in range(first, first + n)], pa.binary()),
        "dt": pa.array(["2026-01-01"] * n, pa.string()),
    }
    for name, values in extra.items():
        cols[name] = pa.array(values)
    return pa.table(cols)


def keys(first: int, n: int, partition: int = 0) -> list[tuple[str, int, str | None, int]]:
    return [("events", partition, "inc-1", o) for o in range(first, first + n)]
