"""Keeping a Delta table healthy: compaction, expiry of old files, conversion of an old parquet table.

A streaming append makes a file per table partition per batch: small files, and a table that reads
slower every hour. ``OPTIMIZE`` rewrites a partition's small files into files of about
``spark.target_file_size``; ``VACUUM`` deletes the files that no version younger than
``spark.vacuum_retention`` needs (the files compaction replaced, a killed batch's orphans). Delta
writes the log's checkpoints itself (every 10 commits) and expires old log entries with them.

Who runs it: the job, in its own driver, every ``spark.maintenance_interval`` while it streams (and
after a ``--once`` run when that much time has passed since the last run), so a table on object
storage keeps one writer (Delta's S3 log store serialises commits within one driver only); and
``mqd table optimize|vacuum`` for an operator, which refuses while the job runs (the job holds
:func:`job_lock`). Maintenance beside an append loses and doubles nothing: ``OPTIMIZE`` commits the
files it rewrote as removed and their union as added in one Delta transaction, and an append adds
only new files, so the two never conflict (Delta's optimistic concurrency checks it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from mqd.config import MqdConfig
from mqd.errors import MqdError
from mqd.fsutil import LockTimeout, locked

_log = structlog.get_logger("mqd.spark")

LOCK_NAME = ".mqd-job.lock"  # in spark.checkpoint_dir: held while the job runs
LAST_RUN_NAME = ".mqd-maintenance"  # in spark.checkpoint_dir: when maintenance last ran (mtime)


class TableBusy(MqdError):
    """The job is running: it maintains the table itself, and a second writer is not safe on S3."""

    retriable = True


@contextlib.contextmanager
def job_lock(config: MqdConfig) -> Iterator[None]:
    """Held by ``mqd spark`` for its whole run and by ``mqd table`` for one command; whoever comes
    second gets :class:`TableBusy` at once."""
    path = Path(config.spark.checkpoint_dir) / LOCK_NAME
    try:
        with locked(path, timeout=0):
            yield
    except LockTimeout:
        raise TableBusy(
            f"the Spark job for {config.spark.output_dir} is running (it holds {path}): it compacts and "
            f"vacuums the table itself every spark.maintenance_interval; stop it to run this by hand"
        ) from None


def _quote(path: Path | str) -> str:
    return "delta.`" + str(path).replace("`", "``") + "`"


@dataclass(frozen=True)
class OptimizeResult:
    files_removed: int
    files_added: int
    partitions_optimized: int


def optimize(spark: Any, table: Path | str, target_bytes: int) -> OptimizeResult:
    """Compact every table partition's files into files of about ``target_bytes``."""
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(target_bytes))
    row = spark.sql(f"OPTIMIZE {_quote(table)}").collect()[0]
    metrics = row["metrics"]
    return OptimizeResult(
        files_removed=int(metrics["numFilesRemoved"]),
        files_added=int(metrics["numFilesAdded"]),
        partitions_optimized=int(metrics["partitionsOptimized"]),
    )


def vacuum(spark: Any, table: Path | str, retention_hours: float) -> None:
    """Delete the files no version younger than ``retention_hours`` references. Delta refuses less
    than 7 days unless its check is off: a reader on an older version, or a streaming reader behind,
    still needs those files. mqd passes ``spark.vacuum_retention``, at least an hour (config)."""
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    spark.sql(f"VACUUM {_quote(table)} RETAIN {retention_hours} HOURS").collect()


def convert(spark: Any, table: Path | str, partition_ddl: str) -> None:
    """Make the parquet table at ``table`` a Delta table in place, from the files its
    ``_spark_metadata`` log lists (Delta's ``CONVERT TO DELTA`` reads that log when it is there, so a
    killed batch's orphan files are not taken in). Idempotent: a Delta table is left as it is."""
    from mqd.spark.table_format import existing_format

    if existing_format(Path(table)) == "delta":
        return
    spark.conf.set("spark.databricks.delta.convert.useMetadataLog", "true")
    parts = f" PARTITIONED BY ({partition_ddl})" if partition_ddl else ""
    spark.sql(f"CONVERT TO DELTA parquet.`{table}`{parts}")


@dataclass(frozen=True)
class TableDescription:
    version: int
    files: int
    bytes: int
    partition_columns: list[str]
    rows: int | None
    last_operation: str | None


def describe(table: Path | str) -> TableDescription:
    """What the table is now, read by delta-rs (no JVM: a quick look from any host)."""
    from deltalake import DeltaTable

    dt = DeltaTable(str(table))
    adds = dt.get_add_actions(flatten=True)
    columns = set(adds.schema.names)
    size = sum(adds.column("size_bytes").to_pylist()) if "size_bytes" in columns else 0
    rows = sum(v or 0 for v in adds.column("num_records").to_pylist()) if "num_records" in columns else None
    history = dt.history(1)
    return TableDescription(
        version=dt.version(),
        files=adds.num_rows,
        bytes=int(size),
        partition_columns=list(dt.metadata().partition_columns),
        rows=rows,
        last_operation=history[0].get("operation") if history else None,
    )


class MaintenanceSchedule:
    """Runs optimize then vacuum when ``spark.maintenance_interval`` has passed since the last run
    (the time is a file's mtime in the checkpoint folder, so it spans restarts and ``--once`` runs)."""

    def __init__(self, config: MqdConfig, tables: list[str], stamp_dir: Path | None = None) -> None:
        sc = config.spark
        self.interval_s = sc.maintenance_interval
        self.target_bytes = sc.target_file_size
        self.retention_hours = sc.vacuum_retention / 3600
        self.retention_s = sc.vacuum_retention
        self.tables = tables
        self.stamp = Path(stamp_dir if stamp_dir is not None else sc.checkpoint_dir) / LAST_RUN_NAME

    def due(self, now: float | None = None) -> bool:
        """An interval has passed since the last run; a table never maintained counts from its
        first look here (a new table has nothing to compact)."""
        if self.interval_s <= 0:
            return False
        try:
            last = self.stamp.stat().st_mtime
        except FileNotFoundError:
            self._touch()
            return False
        return (now if now is not None else time.time()) - last >= self.interval_s

    def done(self) -> None:
        """A run is over: the next is due an interval from now."""
        self._touch()

    def _touch(self) -> None:
        self.stamp.parent.mkdir(parents=True, exist_ok=True)
        self.stamp.touch()

    def run_if_due(self, spark: Any) -> bool:
        """Maintain every table when due; a failure is logged, never fails the job (the table stays
        correct, only slower to read), and is tried again next interval."""
        if not self.due():
            return False
        from delta.tables import DeltaTable

        for table in self.tables:
            if not DeltaTable.isDeltaTable(spark, table):  # no batch committed yet
                continue
            log = _log.bind(table=table)
            try:
                t0 = time.monotonic()
                result = optimize(spark, table, self.target_bytes)
                vacuum(spark, table, self.retention_hours)
                log.info(
                    "table_maintained",
                    files_removed=result.files_removed,
                    files_added=result.files_added,
                    partitions=result.partitions_optimized,
                    seconds=round(time.monotonic() - t0, 2),
                )
            except Exception as exc:  # py4j and Delta raise their own types
                log.warning("table_maintenance_failed", error=str(exc).splitlines()[0][:500])
        self._touch()
        return True


__all__ = [
    "MaintenanceSchedule",
    "OptimizeResult",
    "TableBusy",
    "TableDescription",
    "convert",
    "describe",
    "job_lock",
    "optimize",
    "vacuum",
]
