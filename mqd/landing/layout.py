"""Landing directory layout and the Parquet encoding of one partition's records.

Layout (DESIGN.md §3)::

    <landing>/_format.json                                        the landing's format version
    <landing>/topic=<t>/dt=YYYY-MM-DD/hour=HH/part-<partition:05d>-<incarnation>-<first_offset:020d>.parquet
    <landing>/topic=<t>/dt=YYYY-MM-DD/hour=HH/_COMPLETE          completeness marker (JSON)
    <landing>/_log/<t>/<partition:05d>/claims/<seq:020d>.json    the claim chain: one claim per file
    <landing>/_log/<t>/<partition:05d>/floor.json                 its retention floor
    <landing>/_manifest/<t>/<partition:05d>/<seq>-<seq>.jsonl     claims archived below the floor
    <landing>/_staging/<t>/<partition:05d>/<token>.parquet        staged files (not yet claimed)
    <landing>/_state/<t>/<partition:05d>.json                     the partition's idle watermark
    <landing>/_state/<t>/_markers.json                            hours already marked complete

The same on a local directory and on object storage (format 3, claim_chain.py); format 2's local
layout (``_state`` records with the last offset under a flock, day manifests) is migrated.

A data file holds one contiguous offset range of one (topic, partition, incarnation, hour). Its
name is keyed by partition, log incarnation and first offset, so two publishers of the same records
collide on the name while two incarnations of a log (whose offsets repeat) never do. Files landed
before incarnations existed (format 1) keep their names without one (``part-<p>-<first>.parquet``,
incarnation unknown). Everything that is not data starts with ``_`` or ``.``, which Spark's file
source ignores.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqd import fsutil
from mqd.landing.errors import LandingCorrupt
from mqd.lazy_import import lazy_import
from mqd.topic_name import check_topic_name

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqd import records
    from mqd.landing import schema
else:  # names and claim chains (start positions) need none of these (mqd/lazy_import.py)
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")
    records = lazy_import("mqd.records")
    schema = lazy_import("mqd.landing.schema")


def __getattr__(name: str) -> Any:
    if name == "LANDING_SCHEMA":  # re-exported (mqd.landing.schema's), imported on first use
        return schema.LANDING_SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# a data file's metadata version: 2 adds the incarnation column and range field; 1 is still read
SCHEMA_VERSION = 2
_READABLE_SCHEMA_VERSIONS = (b"1", b"2")
HOUR_MS = 3_600_000
META_VERSION = b"mqd.schema_version"
META_RANGES = b"mqd.ranges"


_NAME = re.compile(r"^part-(\d{5})-(?:([0-9a-f]{32})-)?(\d{20})\.parquet$")
_INCARNATION = re.compile(r"^[0-9a-f]{32}$")
STATE_DIR = "_state"
MANIFEST_DIR = "_manifest"
MARKER_NAME = "_COMPLETE"
# the landing's format (layout, state records, names): 1 = before log incarnations, 2 = with them
# (local: flock + link, object storage: the claim chain), 3 = the claim chain on every store
FORMAT_FILE = "_format.json"
FORMAT_VERSION = 3
FORMAT_STORE = "claim-chain"  # the protocol named in the marker; format 2 with it = format 3's layout
MIGRATE_COMMAND = "mqd landing migrate --config <file>"


def check_incarnation(value: object) -> str | None:
    """A log incarnation id as stored in the landing (32 lowercase hex chars) or None (unknown);
    LandingCorrupt for anything else."""
    if value is None:
        return None
    if not isinstance(value, str) or not _INCARNATION.match(value):
        raise LandingCorrupt(f"bad incarnation {value!r}: expected 32 lowercase hex chars or null")
    return value


@dataclass(frozen=True, slots=True)
class FileRange:
    """What one published file holds; also one manifest line."""

    path: str  # relative to the landing root, '/' separated
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    count: int
    ts_min: int  # ms since epoch
    ts_max: int
    bytes: int = 0
    created: str = ""
    # the log incarnation the offsets belong to; None only for files landed before incarnations
    incarnation: str | None = None
    # the source's leader epoch of a record at or after last_offset in this incarnation (Kafka,
    # KIP-320): what a restart validates the landed position with; None: the source has none
    leader_epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {
            "path": self.path,
            "topic": self.topic,
            "partition": self.partition,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "count": self.count,
            "ts_min": self.ts_min,
            "ts_max": self.ts_max,
            "bytes": self.bytes,
            "created": self.created,
            "incarnation": self.incarnation,
        }
        if self.leader_epoch is not None:  # written only where the source has epochs
            d["leader_epoch"] = self.leader_epoch
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileRange:
        try:
            return cls(
                path=str(d["path"]),
                topic=str(d["topic"]),
                partition=int(d["partition"]),
                first_offset=int(d["first_offset"]),
                last_offset=int(d["last_offset"]),
                count=int(d["count"]),
                ts_min=int(d["ts_min"]),
                ts_max=int(d["ts_max"]),
                bytes=int(d.get("bytes", 0)),
                created=str(d.get("created", "")),
                incarnation=check_incarnation(d.get("incarnation")),
                leader_epoch=None if d.get("leader_epoch") is None else int(d["leader_epoch"]),
            )
        except (KeyError, TypeError, ValueError, LandingCorrupt) as exc:
            raise LandingCorrupt(f"bad file range record {d!r}: {exc}") from None


# ---------------------------------------------------------------------------------------------
# names


# folders exist for event times from 1970 to 9999; records stamped outside (a producer's clock or
# a bug) keep their timestamp column but are filed under the nearest end of that range
_MIN_HOUR = 0
_MAX_HOUR = 253_402_300_799_999 // HOUR_MS


def folder_hours(ts_ms: np.ndarray) -> np.ndarray:
    """Hour index of the folder each timestamp is filed under."""
    hours: np.ndarray = np.clip(ts_ms // HOUR_MS, _MIN_HOUR, _MAX_HOUR)
    return hours


def topic_dir(topic: str) -> str:
    """``topic=t``; InvalidTopicName for a name that could leave the landing (``..``, ``a/b``)."""
    return f"topic={check_topic_name(topic)}"


def topic_state_dir(topic: str) -> str:
    """``_state/t``, checked like topic_dir."""
    return f"{STATE_DIR}/{check_topic_name(topic)}"


def topic_manifest_dir(topic: str) -> str:
    """``_manifest/t``, checked like topic_dir."""
    return f"{MANIFEST_DIR}/{check_topic_name(topic)}"


def hour_dir(topic: str, hour: int) -> str:
    """``topic=t/dt=YYYY-MM-DD/hour=HH`` for an hour index (ms // HOUR_MS)."""
    t = datetime.fromtimestamp(hour * 3600, UTC)
    return f"{topic_dir(topic)}/dt={t:%Y-%m-%d}/hour={t:%H}"


def hour_of_dir(dt: str, hour: str) -> int:
    """Hour index of ``dt=...``/``hour=...`` folder values; ValueError when they are not ours."""
    t = datetime.strptime(f"{dt} {hour}", "%Y-%m-%d %H").replace(tzinfo=UTC)
    return int(t.timestamp()) // 3600


def file_name(partition: int, first_offset: int, incarnation: str | None = None) -> str:
    """A data file's name; keyed by the incarnation too, so offsets reused by a new incarnation of
    the log never collide with the landed ones (None: format-1 names, incarnation unknown)."""
    if incarnation is None:
        return f"part-{partition:05d}-{first_offset:020d}.parquet"
    return f"part-{partition:05d}-{check_incarnation(incarnation)}-{first_offset:020d}.parquet"


def parse_file_name(name: str) -> tuple[int, str | None, int] | None:
    """(partition, incarnation, first_offset) of a data file name, None for anything else."""
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------------------------
# Arrow / Parquet


def concat(batches: list[pa.RecordBatch]) -> pa.Table:
    """One zero-copy table over drained batches (chunks stay where they are)."""
    return pa.Table.from_batches(batches, schema=records.RECORD_SCHEMA)


def hour_runs(table: pa.Table) -> list[tuple[int, int, int]]:
    """Split points of ``table`` into runs of consecutive records in the same hour:
    ``[(hour, start_row, length), ...]``. Vectorised: numpy over the timestamp buffers."""
    n = table.num_rows
    if n == 0:
        return []
    column = table.column(1)
    if not column.null_count:
        # most tables fall within one hour: one min/max over the chunks, not a copy of every stamp
        lo, hi = folder_hours(np.array(stamp_bounds(column), dtype=np.int64))
        if lo == hi:
            return [(int(lo), 0, n)]
    ts = np.concatenate([c.to_numpy(zero_copy_only=False).view(np.int64) for c in column.chunks])
    hours = folder_hours(ts)
    cuts = np.flatnonzero(hours[1:] != hours[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    return [(int(hours[s]), int(s), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def _constant_int32(n: int, value: int) -> pa.Array:
    return records.fixed_width_array(np.full(n, value, dtype=np.int32), pa.int32())


def _constant_string(n: int, value: str | None) -> pa.DictionaryArray:
    """A dictionary column holding ``value`` (or null) n times: one string per file, not per record."""
    if value is None:
        return pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()), pa.array([], type=pa.string()))
    return pa.DictionaryArray.from_arrays(
        _constant_int32(n, 0),
        pa.array([value], type=pa.string()),
    )


def landing_table(topic: str, partition: int, records: pa.Table, incarnation: str | None = None) -> pa.Table:
    """Records (RECORD_SCHEMA) plus the topic, partition and incarnation columns, without
    per-record objects."""
    n = records.num_rows
    part_col = _constant_int32(n, partition)
    return pa.Table.from_arrays(
        [_constant_string(n, topic), part_col, _constant_string(n, incarnation), *records.columns],
        schema=schema.LANDING_SCHEMA,
    )


def describe(topic: str, partition: int, records: pa.Table) -> tuple[int, int, int, int, int]:
    """(first_offset, last_offset, count, ts_min, ts_max) of a non-empty records table."""
    offsets = records.column("offset")
    ts_min, ts_max = stamp_bounds(records.column("timestamp"))
    return (int(offsets[0].as_py()), int(offsets[-1].as_py()), records.num_rows, ts_min, ts_max)


def stamp_bounds(column: pa.ChunkedArray) -> tuple[int, int]:
    """The least and greatest timestamp (ms) of a timestamp column, nulls left out: numpy over each
    chunk's values buffer (Arrow's ``min_max`` would import pyarrow.compute, ~50 ms of a burst's
    CPU, for this alone). ValueError when the column holds no timestamp."""
    lo = hi = None
    for chunk in column.chunks:
        if chunk.null_count == len(chunk):
            continue
        values = chunk.view(pa.int64()).to_numpy(zero_copy_only=not chunk.null_count)
        if chunk.null_count:  # float64 with NaN where the nulls are: exact below 2**53 ms
            values = values[~np.isnan(values)]
        least, greatest = int(values.min()), int(values.max())
        lo = least if lo is None else min(lo, least)
        hi = greatest if hi is None else max(hi, greatest)
    if lo is None or hi is None:
        raise ValueError("no timestamp in the column")
    return lo, hi


def parquet_options(compression: str) -> dict[str, Any]:
    """The Parquet writer options of every landing file (``pq.ParquetWriter`` keywords)."""
    return {
        "compression": None if compression == "none" else compression,
        # one string a file for topic and incarnation; values are mostly unique: a dictionary
        # there would only cost CPU
        "use_dictionary": ["topic", "incarnation", "key"],
        # consecutive offsets: a few bytes a page instead of 8 a record, and cheaper to encode than
        # plain (every reader the project tests, Spark 3.3+ included, reads it)
        "column_encoding": {"offset": "DELTA_BINARY_PACKED"},
        "write_statistics": ["partition", "offset", "timestamp"],
    }


def write_parquet(path: Path, table: pa.Table, rng: FileRange, compression: str) -> int:
    """Write ``table`` with the file's range in its metadata, fsync it, return its size."""
    meta = {
        META_VERSION: str(SCHEMA_VERSION).encode(),
        META_RANGES: json.dumps([rng.to_json()]).encode(),
    }
    table = table.replace_schema_metadata(meta)
    pq.write_table(table, path, **parquet_options(compression))
    return fsutil.fsync_written_once(path)


def read_ranges(path: Path) -> list[FileRange]:
    """The ranges recorded in a data file's metadata; LandingCorrupt for foreign or broken files."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise LandingCorrupt(f"{path}: not a readable Parquet file: {exc}") from None
    if meta.get(META_VERSION) not in _READABLE_SCHEMA_VERSIONS or META_RANGES not in meta:
        raise LandingCorrupt(f"{path}: not an mqd landing file (no {META_RANGES.decode()} metadata)")
    try:
        return [FileRange.from_json(d) for d in json.loads(meta[META_RANGES])]
    except ValueError as exc:
        raise LandingCorrupt(f"{path}: bad range metadata: {exc}") from None


# ---------------------------------------------------------------------------------------------
# durable small files

# The landing code calls these through this module (bench/profile/probe.py times them here).
write_atomic = fsutil.atomic_write
fsync_dir = fsutil.fsync_dir


def makedirs_durable(path: Path, stop_at: Path) -> None:
    """Create ``path`` and fsync the parent of every folder created, up to ``stop_at``."""
    if path.is_dir():
        return
    missing: list[Path] = []
    p = path
    while not p.is_dir() and p != stop_at and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            pass
        fsync_dir(d.parent)


def append_line(path: Path, line: bytes) -> None:
    """Append one line with a single O_APPEND write and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
