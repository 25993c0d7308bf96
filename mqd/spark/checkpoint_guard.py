"""A checkpoint that does not match its table is refused before any query starts (issue 31).

Deleting a streaming query's checkpoint while keeping its table is a common Spark operator move, and
restoring an older copy of it is another. Either way Spark starts again from an earlier batch, and
what follows depends on the table:

- ``parquet`` (Spark's file sink): ``_spark_metadata`` already lists batches 0..N, so Spark takes
  batches up to N as written and skips them; the checkpoint then marks them committed, the landing's
  lifecycle records their files as committed, and the cleaner deletes files that never reached the
  table: loss.
- ``delta`` and ``iceberg``: a new checkpoint brings a new query id, which no commit of the table
  carries, so every landed file is appended again: duplicates. An older copy keeps the query id, and
  a batch it plans anew (other files than the first time) is skipped as written by its id: loss.

So at start the job compares the checkpoint with what its table says its writer committed, and a
table that is ahead of its checkpoint (or written by another query) stops the job (exit 2) with the
recovery: restore the checkpoint that belongs to the table, or give the table a new place (a new
``spark.output_dir`` and ``spark.checkpoint_dir`` re-read the whole landing into a new table).
One batch ahead is the crash window between the table's commit and the checkpoint's, which the sinks
handle themselves (Delta's ``txn``, the Iceberg sink's token; the file sink's log).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqd.landing import lifecycle
from mqd.spark.table_format import DELTA_LOG, SPARK_METADATA

STREAMING_UPDATE = "STREAMING UPDATE"  # Delta's operation name for a streaming sink's commit
TXN_KEY = "_mqd_txn"  # a history entry's txn action, when its commit has one (read from the log)
_COMMIT = re.compile(r"[0-9]{20}\.json")  # a Delta commit file (not a checkpoint or a temp file)


@dataclass(frozen=True)
class TableWriter:
    """The streaming query that last committed to a table, and its highest batch there."""

    query_id: str | None  # None: a file-sink table, whose log does not name its query
    batch: int


def checkpoint_query_id(checkpoint: Path) -> str | None:
    """The query id a checkpoint belongs to (its ``metadata`` file), None for a new checkpoint."""
    try:
        data = json.loads((Path(checkpoint) / "metadata").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    qid = data.get("id") if isinstance(data, dict) else None
    return str(qid) if qid else None


def file_sink_writer(table: Path) -> TableWriter | None:
    """The highest batch Spark's file sink logged in ``_spark_metadata`` (``N`` or ``N.compact``)."""
    log = Path(table) / SPARK_METADATA
    batches = [
        int(p.name.split(".")[0]) for p in log.glob("*") if p.name.split(".")[0].isdigit() and p.is_file()
    ]
    return TableWriter(None, max(batches)) if batches else None


def delta_writer(history: list[dict[str, Any]]) -> TableWriter | None:
    """From Delta's history (newest first, as ``DESCRIBE HISTORY`` gives it): the newest streaming
    commit's query id and batch (``epochId``), or the newest commit carrying a ``txn`` action (a
    ``foreachBatch`` sink's idempotent write, mqd/spark/typed_sink.py: the query id as its
    ``appId``, the batch as its ``version``; read from the log only, TXN_KEY)."""
    for entry in history:
        txn = entry.get(TXN_KEY)
        if isinstance(txn, dict) and "appId" in txn and "version" in txn:
            return TableWriter(str(txn["appId"]), int(txn["version"]))
        if entry.get("operation") != STREAMING_UPDATE:
            continue
        params = entry.get("operationParameters") or {}
        if "queryId" in params and "epochId" in params:
            return TableWriter(str(params["queryId"]), int(params["epochId"]))
    return None


def delta_log_history(table: Path, limit: int = 100) -> list[dict[str, Any]]:
    """The ``commitInfo`` of the newest ``limit`` commits of the Delta table at ``table``, newest
    first, read from its ``_delta_log`` JSON files (milliseconds, no JVM: asking Spark for the
    history cost 4-8 s of a ``--once`` start). Commits Delta already folded into a checkpoint and
    expired are not there; the newest ones always are (log retention is 30 days)."""
    log = Path(table) / DELTA_LOG
    commits = sorted((p for p in log.glob("*.json") if _COMMIT.fullmatch(p.name)), reverse=True)
    history: list[dict[str, Any]] = []
    for path in commits[:limit]:
        info: dict[str, Any] | None = None
        txn: Any = None
        for line in path.read_text(encoding="utf-8").splitlines():
            if '"commitInfo"' in line:
                found = json.loads(line).get("commitInfo")
                info = found if isinstance(found, dict) else None
            elif '"txn"' in line:
                txn = json.loads(line).get("txn")
        if info is not None:
            history.append({**info, TXN_KEY: txn} if txn is not None else info)
    return history


def problem(table: str, checkpoint: Path, writer: TableWriter | None) -> str | None:
    """Why the checkpoint cannot write the table its writer left (None: it can)."""
    if writer is None:
        return None
    query = checkpoint_query_id(checkpoint)
    last = lifecycle.last_committed_batch(checkpoint)
    fix = (
        f"restore the checkpoint that belongs to the table, or give the table a new place (a new "
        f"spark.output_dir and spark.checkpoint_dir re-read the whole landing); {checkpoint} was "
        f"neither used nor changed"
    )
    if query is not None and last is None and writer.batch == 0 and writer.query_id in (None, query):
        return None  # this query's first batch committed to the table, not yet to its checkpoint
    if query is None or last is None:
        return (
            f"{table} already holds batches up to {writer.batch}"
            + (f" of query {writer.query_id}" if writer.query_id else "")
            + f", but its checkpoint {checkpoint} is new: a new checkpoint would read every landed "
            f"file again (duplicates) or take the table's batches as its own (loss): {fix}"
        )
    if writer.query_id is not None and writer.query_id != query:
        return f"{table} was written by query {writer.query_id}, not by the checkpoint's query {query}: {fix}"
    if writer.batch > last + 1:  # one ahead: a commit the checkpoint did not record yet (sinks handle it)
        return (
            f"{table} holds batches up to {writer.batch}, but its checkpoint {checkpoint} committed only "
            f"up to {last} (an older copy?): batches planned anew would be skipped as written: {fix}"
        )
    return None


def table_writer(
    spark: Any, table_format: str, location: str, file_io: dict[str, str] | None = None
) -> TableWriter | None:
    """What the table at ``location`` says its streaming writer committed (``file_io``: an Iceberg
    table's FileIO properties, for one on S3)."""
    if table_format == "parquet":
        return file_sink_writer(Path(location))
    if table_format == "delta":
        if "://" not in location:  # a table on disk: its log read directly
            return delta_writer(delta_log_history(Path(location)))
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, location):
            return None
        rows = DeltaTable.forPath(spark, location).history(100).collect()
        return delta_writer([r.asDict(recursive=True) for r in rows])
    if table_format == "iceberg":
        from mqd.spark.iceberg_sink import iceberg_writer

        found = iceberg_writer(location, file_io)
        return None if found is None else TableWriter(*found)
    return None


__all__ = [
    "TableWriter",
    "checkpoint_query_id",
    "delta_writer",
    "file_sink_writer",
    "problem",
    "table_writer",
]
