"""Keeping an Iceberg table healthy without Spark: compaction of small files and expiry of old
snapshots with the files only they referenced (pyiceberg has neither ``rewrite_data_files`` nor file
removal on expiry, so this module does both with pyiceberg's own parts).

**Compaction** (:func:`compact`): within each partition of the current snapshot, the files smaller
than half of ``target_bytes`` are read (pyiceberg's Arrow scan, so older files missing a column read
it as null), written again as files of up to the target (pyiceberg's writer, the table's
``write.target-file-size-bytes``), and swapped in one snapshot that deletes the old files and adds
the new, checked first to hold the same number of rows. pyiceberg writes that snapshot as an
``overwrite`` (it cannot write a ``replace``): an Iceberg streaming reader of the table needs
``streaming-skip-overwrite-snapshots``. The snapshot carries the newest exactly-once token of the
table (``mqd.query-id``, ``mqd.batch-id``, iceberg_sink.py), so the sink's re-run check, which stops
at the newest snapshot with a token, never needs the appends before it.

**Expiry** (:func:`expire`): snapshots older than ``retention_s`` are removed from the metadata (never
the current one), then every file that only they referenced is deleted: their manifest lists, the
manifests and data files no kept snapshot lists. A reader still on a snapshot younger than the
retention keeps every file it needs. Files no snapshot ever listed (a batch killed before its
commit) are left alone: telling one from a batch being written needs a clock, and they are few.

Both run in the job's driver between batches (the sink's ``foreachBatch``, the table's one writer),
and as ``mqd table optimize|vacuum`` while the job is stopped. A commit that loses to another writer
is logged and retried at the next run; the files it wrote are in no snapshot.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from mqd.spark.table_maintenance import TableDescription

_log = structlog.get_logger("mqd.spark")

QUERY_ID_PROPERTY = "mqd.query-id"  # iceberg_sink's token (imported there from here: one name)
BATCH_ID_PROPERTY = "mqd.batch-id"
OPERATION_PROPERTY = "mqd.operation"  # "compaction" on the snapshots compact() commits


@dataclass(frozen=True)
class CompactionResult:
    files_removed: int
    files_added: int
    partitions_compacted: int
    rows: int


@dataclass(frozen=True)
class ExpiryResult:
    snapshots_expired: int
    files_deleted: int


def newest_token(table: Table) -> dict[str, str]:
    """The newest exactly-once token among the current snapshot and its ancestors ({} if none)."""
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is not None and summary[QUERY_ID_PROPERTY] is not None:
            return {
                QUERY_ID_PROPERTY: str(summary[QUERY_ID_PROPERTY]),
                BATCH_ID_PROPERTY: str(summary[BATCH_ID_PROPERTY]),
            }
    return {}


def _groups(table: Table) -> dict[tuple[int, str], list[Any]]:
    """The current snapshot's scan tasks by (spec id, partition)."""
    groups: dict[tuple[int, str], list[Any]] = {}
    for task in table.scan().plan_files():
        f = task.file
        groups.setdefault((f.spec_id, repr(f.partition)), []).append(task)
    return groups


def compact(table: Table, target_bytes: int) -> CompactionResult:
    """Rewrite each partition's small files (under half the target) into files of up to the
    target, one snapshot for the whole table; nothing when no partition has two small files."""
    table.refresh()
    if table.current_snapshot() is None:
        return CompactionResult(0, 0, 0, 0)
    small = [
        tasks
        for tasks in (
            [t for t in group if t.file.file_size_in_bytes < target_bytes // 2]
            for group in _groups(table).values()
        )
        if len(tasks) >= 2
    ]
    if not small:
        return CompactionResult(0, 0, 0, 0)
    if table.properties.get("write.target-file-size-bytes") != str(target_bytes):
        with table.transaction() as txn:
            txn.set_properties({"write.target-file-size-bytes": str(target_bytes)})
        table.refresh()
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    removed: list[DataFile] = []
    added: list[DataFile] = []
    rows = 0
    write_uuid = uuid.uuid4()
    for tasks in small:
        data = scan.to_table(tasks)
        expected = sum(t.file.record_count for t in tasks)
        if data.num_rows != expected:  # a file with deletes, or a reader bug: never lose rows
            raise ValueError(f"compaction read {data.num_rows} rows from files that hold {expected}")
        added += list(_dataframe_to_data_files(table.metadata, _conform(data, table), table.io, write_uuid))
        removed += [t.file for t in tasks]
        rows += data.num_rows
    properties = {**newest_token(table), OPERATION_PROPERTY: "compaction"}
    with table.transaction() as txn:
        with txn.update_snapshot(snapshot_properties=properties).overwrite(write_uuid) as overwrite:
            for f in removed:
                overwrite.delete_data_file(f)
            for f in added:
                overwrite.append_data_file(f)
    return CompactionResult(len(removed), len(added), len(small), rows)


def _conform(data: pa.Table, table: Table) -> pa.Table:
    """``data`` with the table's current schema as pyiceberg's writer expects it."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return data.cast(schema_to_pyarrow(table.schema(), include_field_ids=False))


def _files_of(snapshot: Snapshot, table: Table, manifests: dict[str, set[str]]) -> set[str]:
    """The manifest list, manifests and live data files of ``snapshot`` (``manifests``: a cache of
    each manifest's data files: manifests never change)."""
    files = {snapshot.manifest_list}
    for manifest in snapshot.manifests(table.io):
        files.add(manifest.manifest_path)
        if manifest.manifest_path not in manifests:
            manifests[manifest.manifest_path] = {
                e.data_file.file_path
                for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
                if e.status != ManifestEntryStatus.DELETED
            }
        files |= manifests[manifest.manifest_path]
    return files


def expire(table: Table, retention_s: float, now: float | None = None) -> ExpiryResult:
    """Expire the snapshots older than ``retention_s`` (never the current one) and delete the files
    that only they referenced."""
    table.refresh()
    current = table.current_snapshot()
    if current is None:
        return ExpiryResult(0, 0)
    cutoff_ms = int(((now if now is not None else time.time()) - retention_s) * 1000)
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    old = [
        s for s in table.metadata.snapshots if s.timestamp_ms < cutoff_ms and s.snapshot_id not in protected
    ]
    if not old:
        return ExpiryResult(0, 0)
    kept = [s for s in table.metadata.snapshots if s.snapshot_id not in {o.snapshot_id for o in old}]
    manifests: dict[str, set[str]] = {}
    still_needed = set().union(*(_files_of(s, table, manifests) for s in kept))
    gone = set().union(*(_files_of(s, table, manifests) for s in old)) - still_needed
    table.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in old]).commit()
    deleted = _delete(table, sorted(gone))
    table.refresh()
    return ExpiryResult(len(old), deleted)


def _delete(table: Table, paths: Iterable[str]) -> int:
    deleted = 0
    for path in paths:
        try:
            table.io.delete(path)
            deleted += 1
        except FileNotFoundError:  # deleted by an earlier run that stopped half way
            pass
    return deleted


def describe(table: Table) -> TableDescription:
    """The table now, from its current snapshot's summary (no data file is read)."""
    table.refresh()
    snapshot = table.current_snapshot()
    summary = snapshot.summary if snapshot is not None and snapshot.summary is not None else None

    def total(key: str) -> int:
        value = summary[key] if summary is not None else None
        return int(value) if value is not None else 0

    return TableDescription(
        version=table.last_sequence_number,
        files=total("total-data-files"),
        bytes=total("total-files-size"),
        partition_columns=[f"{f.name} ({f.transform})" for f in table.spec().fields],
        rows=total("total-records") if summary is not None else 0,
        last_operation=(summary[OPERATION_PROPERTY] or summary.operation.value)
        if summary is not None
        else None,
    )


def maintain(table: Table, target_bytes: int, retention_s: float, *, table_name: str) -> None:
    """Compaction then expiry, logged; a failure is logged and never fails the caller (the table
    stays correct, only slower to read): tried again at the next run."""
    log = _log.bind(table=table_name)
    t0 = time.monotonic()
    try:
        done = compact(table, target_bytes)
        expired = expire(table, retention_s)
    except Exception as exc:  # pyiceberg and pyarrow raise their own types
        log.warning(
            "table_maintenance_failed", error=str(exc).splitlines()[0][:500] if str(exc) else repr(exc)
        )
        return
    log.info(
        "table_maintained",
        files_removed=done.files_removed,
        files_added=done.files_added,
        partitions=done.partitions_compacted,
        snapshots_expired=expired.snapshots_expired,
        files_deleted=expired.files_deleted,
        seconds=round(time.monotonic() - t0, 2),
    )


__all__ = [
    "BATCH_ID_PROPERTY",
    "OPERATION_PROPERTY",
    "QUERY_ID_PROPERTY",
    "CompactionResult",
    "ExpiryResult",
    "compact",
    "describe",
    "expire",
    "maintain",
    "newest_token",
]
