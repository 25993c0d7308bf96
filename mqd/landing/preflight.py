"""The landing's first encode, at start: two records through the publication's own steps into memory.

Why, twice over:
- *Fail at start, not at the first publication.* A pyarrow built without the configured codec, or a
  broken install, would otherwise show only when the first file is due, possibly hours later on a
  quiet topic, with records fetched and nowhere to go. The daemon fails now, naming
  ``landing.compression``.
- *The daemon's idle memory includes its code.* The first encode pages in the Parquet writer and
  the codec (library code a burst otherwise touches first; Arrow's compute module is never imported,
  mqd/landing/layout.py ``stamp_bounds``). The
  memory gauge takes its baseline after it (mqd/consumer/memory_gauge.py), so what the byte budget
  bounds is what records cost, not what loading the code once costs.

Nothing is written anywhere: the file is encoded into a buffer and its footer read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqd.landing.errors import PreflightError
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqd import records
    from mqd.landing import layout, publisher, stage_writer
else:  # off the daemon's start path (mqd/lazy_import.py): this runs on a landing thread
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")
    records = lazy_import("mqd.records")
    layout = lazy_import("mqd.landing.layout")
    publisher = lazy_import("mqd.landing.publisher")
    stage_writer = lazy_import("mqd.landing.stage_writer")

_TOPIC = "mqd-preflight"
_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00Z: any fixed hour


def _records() -> pa.Table:
    headers = pa.array([[{"key": "h", "value": b"v"}], []], type=records.HEADERS_TYPE)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([0, 1], pa.int64()),
            pa.array([_TS_MS, _TS_MS + 1], pa.timestamp("ms", tz="UTC")),
            pa.array([None, b"k"], pa.binary()),
            pa.array([b"v" * 100, None], pa.binary()),
            headers,
        ],
        schema=records.RECORD_SCHEMA,
    )
    return layout.concat([batch])


def encode_check(compression: str) -> int:
    """Encode a two-record landing file with ``compression`` as a publication does and read its
    footer back; returns the file's size. PreflightError names the setting when it fails."""
    try:
        records = _records()
        runs = layout.hour_runs(records)
        rng = publisher.file_range(_TOPIC, 0, records)
        sink = pa.BufferOutputStream()
        stage = stage_writer.ParquetStage(sink, "preflight", compression, done=lambda: 0, drop=lambda: None)
        for _hour, start, length in runs:
            stage.write(layout.landing_table(_TOPIC, 0, records.slice(start, length)))
        stage.finish(rng)
        data = sink.getvalue()
        meta = pq.read_metadata(pa.BufferReader(data))
        if meta.num_rows != records.num_rows:
            raise ValueError(f"the footer says {meta.num_rows} rows, {records.num_rows} were written")
    except Exception as exc:
        raise PreflightError(
            f"landing.compression = {compression!r}: the landing cannot encode a Parquet file "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return int(data.size)
