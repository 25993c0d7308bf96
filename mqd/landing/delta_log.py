"""The landing as a Delta table: the Delta log at the landing's root.

The data files are the landing's own (the claim chain published them, layout.py names them); this
module only registers them in a Delta log (``<landing>/_delta_log/``), which every Delta reader
(delta-rs, DuckDB's ``delta_scan``, Polars, Spark) reads. Nothing here decides what is published:
the committer (table_committer.py) asks the claim chains and this module writes what they say.

- **Schema.** The landing schema (schema.py) with its dictionary strings as strings, then the
  folder keys ``dt`` (string) and ``hour`` (int), the Hive columns Spark's file source reads too.
  ``topic``, ``dt`` and ``hour`` are the partition columns, so the folder names are the partition
  values (readers that check one against the other, Polars, read the table). A file also holds its
  ``topic`` column; readers take a partition column's value from the log, not from the file.
- **Adds.** One ``add`` per file, its statistics from the file's range (no read of the file):
  ``numRecords``; min/max of ``partition``, ``incarnation``, ``offset`` and ``timestamp``; their
  null counts (0, except an unknown incarnation).
- **Exactly once.** Each commit carries one ``txn`` action per (topic, partition, incarnation) it
  adds files of: ``appId`` = ``app_id(...)``, ``version`` = the last offset added. A file is in the
  table iff its incarnation's ``txn`` version is at or past its last offset (offsets ascend within
  an incarnation of a chain). A commit is refused when a commit that landed after the version it
  read holds a ``txn`` of the same ``appId`` (delta_commits.py): two committers that computed the
  same missing files from one version cannot both add them (``StaleCommit``).
- **Who writes what.** The table's creation (version 0: the protocol and the metadata, the schema
  as delta-rs writes it) and the committer's reads and adds go through delta_commits.py (its own
  reader and create-only writer: a round costs what it adds, not what the table lists, decision
  062; a burst into a new landing imports no delta-rs, decision 061); its checkpoints and the
  expiry of old entries, and the cleaner's file list and removes go through delta-rs, which needs
  the whole table for each.
- **Removes.** The lifecycle's cleaner removes a file from the table (``remove``,
  ``dataChange=false``: a streaming reader sees no change) before it deletes it.
- **Log.** Table properties at creation: a checkpoint every ``checkpoint_interval`` commits, log
  entries older than ``log_retention`` expire at checkpoints, ``delta.appendOnly`` (a ``DELETE``
  through the table would rewrite landing files the claim chain owns). Expired entries are looked
  for only after a commit that writes a checkpoint (delta-rs's default: after every commit).

Both writers put the log's entries create-only: ``os.link``-like on a local disk, ``If-None-Match``
on S3 (the landing already requires it: store.py's probe).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import structlog

from mqd import __version__
from mqd.landing.delta_commits import READER_VERSION, WRITER_VERSION, DeltaCommits
from mqd.landing.errors import LandingError, StaleCommit, TableError
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import deltalake
    import deltalake.exceptions
    import pyarrow as pa

    from mqd.landing import schema
else:
    deltalake = lazy_import("deltalake")
    pa = lazy_import("pyarrow")
    schema = lazy_import("mqd.landing.schema")

log = structlog.get_logger("mqd.landing")

DELTA_LOG = "_delta_log"
PARTITION_BY = ("topic", "dt", "hour")
APP_PREFIX = "mqd-landing"
# delta-rs retries a commit that lost a race with a commit of other partitions (no conflict) this
# often; every daemon of a landing commits every few seconds, so dozens of races are possible
MAX_COMMIT_RETRIES = 200


def app_id(topic: str, partition: int, incarnation: str | None) -> str:
    """The ``txn`` appId of one partition's log incarnation (a recreated topic is a new appId, so
    its offsets, which start again, are never taken for landed ones)."""
    return f"{APP_PREFIX}/{topic}/{partition}/{incarnation or 'none'}"


def table_schema() -> pa.Schema:
    """The table's Arrow schema: the landing's columns (dictionaries as their values), dt, hour."""
    fields = [
        pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
        for f in schema.LANDING_SCHEMA
    ]
    return pa.schema([*fields, pa.field("dt", pa.string()), pa.field("hour", pa.int32())])


def partition_values(path: str) -> dict[str, str | None]:
    """The partition values of a landed file, read from its folders (layout.hour_dir):
    ``topic=t/dt=YYYY-MM-DD/hour=HH/...`` -> {topic: t, dt: YYYY-MM-DD, hour: "H"}."""
    parts = path.split("/")
    try:
        keys = dict(p.split("=", 1) for p in parts[:3])
        return {"topic": keys["topic"], "dt": keys["dt"], "hour": str(int(keys["hour"]))}
    except (KeyError, ValueError):
        raise LandingError(f"{path}: not a landed file's path (topic=/dt=/hour= folders)") from None


def _iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def stats(rng: FileRange) -> str:
    """The ``add`` action's statistics, from the file's range alone (exact: the range is the
    file's own metadata)."""
    known = rng.incarnation is not None
    d: dict[str, Any] = {
        "numRecords": rng.count,
        "minValues": {
            "partition": rng.partition,
            "offset": rng.first_offset,
            "timestamp": _iso_ms(rng.ts_min),
        },
        "maxValues": {
            "partition": rng.partition,
            "offset": rng.last_offset,
            "timestamp": _iso_ms(rng.ts_max),
        },
        "nullCount": {"partition": 0, "offset": 0, "timestamp": 0, "incarnation": 0 if known else rng.count},
    }
    if known:
        d["minValues"]["incarnation"] = d["maxValues"]["incarnation"] = rng.incarnation
    return json.dumps(d, separators=(",", ":"))


def _created_ms(rng: FileRange) -> int:
    try:
        return int(datetime.fromisoformat(rng.created).timestamp() * 1000)
    except ValueError:
        return int(time.time() * 1000)


def storage_options(uri: str, endpoint_url: str | None, region: str | None) -> dict[str, str] | None:
    """delta-rs's (object_store's) options for an ``s3://`` landing: the endpoint and region of
    ``[landing.s3]``; credentials from the AWS variables (or the instance's role), as object_store
    reads them. None for a local landing."""
    if not uri.startswith("s3://"):
        return None
    opts: dict[str, str] = {}
    if endpoint_url:
        opts["AWS_ENDPOINT_URL"] = endpoint_url
        if endpoint_url.startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"):
        opts["AWS_REGION"] = region or os.environ.get("AWS_REGION") or os.environ["AWS_DEFAULT_REGION"]
    return opts


def table_uri(location: str | Path) -> str:
    """The table's URI: the landing's root (an absolute path, or ``s3://bucket/prefix``)."""
    s = str(location)
    return s.rstrip("/") if s.startswith("s3://") else str(Path(s).resolve())


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _text(exc: BaseException) -> str:
    """delta-rs's error text on one line, without its terminal colours."""
    return " ".join(_ANSI.sub("", str(exc)).replace("\u21b3", "").split())


def _is_concurrent(exc: BaseException) -> bool:
    return "concurrent transaction" in str(exc).lower()


def table_exists(uri: str, storage: dict[str, str] | None = None) -> bool:
    """Whether ``uri`` holds a Delta log."""
    return bool(deltalake.DeltaTable.is_deltatable(uri, storage_options=storage))


def add_action(rng: FileRange) -> dict[str, Any]:
    """One ``add`` action (the JSON delta-rs writes for the same file, without its null fields)."""
    return {
        "add": {
            "path": quote(rng.path, safe="/="),
            "partitionValues": partition_values(rng.path),
            "size": rng.bytes,
            "modificationTime": _created_ms(rng),
            "dataChange": True,
            "stats": stats(rng),
        }
    }


class LandingTable:
    """The Delta log of one landing. Blocking (file or network I/O); one thread at a time.

    The committer's side (``load``, ``committed``, ``add``) reads and writes the log itself
    (delta_commits.py: one new commit at a time, whatever the table's size); the cleaner's side
    (``listed``, ``remove``) and the checkpoints go through delta-rs."""

    def __init__(
        self,
        uri: str,
        objects: Objects,
        *,
        storage: dict[str, str] | None = None,
        checkpoint_interval: int = 100,
        log_retention_s: float = 3600.0,
    ) -> None:
        self.uri = uri
        self.storage = storage
        self.checkpoint_interval = checkpoint_interval
        self.log_retention_s = log_retention_s
        self.commits = DeltaCommits(objects, max_retries=MAX_COMMIT_RETRIES)
        self.checkpoint_errors = 0  # checkpoints or cleanups that failed after their commit
        self._table: deltalake.DeltaTable | None = None  # delta-rs's, for the cleaner only
        self._schema: pa.Schema | None = None
        # False: expired log entries are looked for only after a commit that writes a checkpoint
        # (what can expire changes once per checkpoint interval); True: after every commit, as
        # delta-rs does by default (bench.landing_table_log measures the difference)
        self.cleanup_every_commit = False

    def properties(self) -> dict[str, str | None]:
        return {
            "delta.checkpointInterval": str(self.checkpoint_interval),
            "delta.logRetentionDuration": f"interval {max(1, round(self.log_retention_s))} seconds",
            "delta.enableExpiredLogCleanup": "true",
            "delta.appendOnly": "true",
        }

    def load(self, *, create: bool = True) -> bool:
        """Read the log up to its newest commit (creating the table, empty, when there is none and
        ``create``); False when there is no table. TableError when the store does not answer."""
        try:
            if self.commits.refresh():
                return True
            if not create:
                return False
            self._create()
            if not self.commits.refresh():
                raise TableError(f"{self.uri}: the table was created but its log is not there")
            return True
        except OSError as exc:
            raise TableError(f"{self.uri}: reading the Delta log: {exc}") from None

    def _create(self) -> None:
        """Version 0, written create-only by mqd's own writer (delta-rs's create imported ~30 ms of
        deltalake into every burst of a new landing): the protocol and the table's metadata, the
        schema as delta-rs writes it (tests/integration/landing/test_delta_commits.py), no files.
        A create that lost the race to another daemon's reads theirs."""
        now = int(time.time() * 1000)
        metadata = {
            "id": str(uuid.uuid4()),
            "name": "mqd_landing",
            "description": "mqd's landing: the files the claim chains published (mqd/landing/delta_log.py)",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(schema.spark_json_struct(table_schema()), separators=(",", ":")),
            "partitionColumns": list(PARTITION_BY),
            "createdTime": now,
            "configuration": self.properties(),
        }
        info = {
            "timestamp": now,
            "operation": "CREATE TABLE",
            "operationParameters": {"mode": "ErrorIfExists", "location": self.uri},
            "engineInfo": f"mqd/{__version__}",
        }
        protocol = {"minReaderVersion": READER_VERSION, "minWriterVersion": WRITER_VERSION}
        if self.commits.create([{"protocol": protocol}, {"metaData": metadata}], info):
            log.info("landing table created", table=self.uri)

    @property
    def version(self) -> int | None:
        return None if self.commits.version < 0 else self.commits.version

    def txn_version(self, app: str) -> int | None:
        """The ``txn`` version of ``app`` in the loaded log (None: never committed)."""
        assert self.commits.version >= 0, "load() first"
        return self.commits.txns.get(app)

    def committed(self, rng: FileRange) -> bool:
        """Whether the loaded log holds ``rng`` (its incarnation's ``txn`` at or past its last
        offset)."""
        v = self.txn_version(app_id(rng.topic, rng.partition, rng.incarnation))
        return v is not None and rng.last_offset <= v

    def add(self, files: Iterable[FileRange], *, committer: str = "") -> int:
        """One commit adding ``files`` (in chain order per partition) with one ``txn`` per (topic,
        partition, incarnation); the new table version. StaleCommit when a commit since the loaded
        version holds a ``txn`` of one of them; TableError for any other failure."""
        files = list(files)
        last: dict[str, int] = {}
        for f in files:
            app = app_id(f.topic, f.partition, f.incarnation)
            last[app] = max(last.get(app, f.last_offset), f.last_offset)
        now = int(time.time() * 1000)
        info = {
            "timestamp": now,
            "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": json.dumps(list(PARTITION_BY))},
            "isBlindAppend": True,
            "engineInfo": f"mqd/{__version__}",
            "mqd.committer": committer,
            "mqd.files": len(files),
        }
        txns = [{"txn": {"appId": app, "version": v, "lastUpdated": now}} for app, v in sorted(last.items())]
        version = self.commits.commit([*txns, *(add_action(f) for f in files)], info)
        self._after_commit(version)
        return version

    def _checkpoint_due(self, version: int) -> bool:
        """delta-rs's rule, kept so every writer of the log checkpoints the same versions: v when
        v + 1 is a multiple of the table's interval."""
        try:
            interval = int(
                self.commits.configuration.get("delta.checkpointInterval") or self.checkpoint_interval
            )
        except ValueError:
            interval = self.checkpoint_interval
        return (version + 1) % max(1, interval) == 0

    def _after_commit(self, version: int) -> None:
        """The checkpoint of a commit that completes an interval, then the expired log entries
        (delta-rs: both need the whole table, once an interval). A failure is logged and counted,
        never the commit's: the next interval's checkpoint covers this one."""
        checkpoint = self._checkpoint_due(version)
        if not (checkpoint or self.cleanup_every_commit):
            return
        try:
            self.checkpoint(version, write=checkpoint, cleanup=True)
        except TableError as exc:
            self.checkpoint_errors += 1
            log.warning("landing table checkpoint failed; the next interval writes one", error=str(exc))

    def checkpoint(self, version: int | None = None, *, write: bool = True, cleanup: bool = False) -> None:
        """A checkpoint of ``version`` (the newest read), then, with ``cleanup``, the log entries
        expired by the table's retention deleted (delta-rs loads the whole table for both)."""
        at = self.commits.version if version is None else version
        try:
            table = deltalake.DeltaTable(self.uri, version=at, storage_options=self.storage)
            if write:
                table.create_checkpoint()
            if cleanup:
                table.cleanup_metadata()
        except (OSError, deltalake.exceptions.DeltaError) as exc:
            raise TableError(f"{self.uri}: checkpoint of version {at}: {_text(exc)}") from None

    def _delta(self) -> deltalake.DeltaTable:
        """delta-rs's table at the newest version (the cleaner's file list and removes)."""
        if self._table is None:
            self._table = deltalake.DeltaTable(self.uri, storage_options=self.storage)
        else:
            self._table.update_incremental()
        return self._table

    def remove(self, files: Iterable[FileRange]) -> int:
        """One commit removing ``files`` with ``dataChange=false`` (the cleaner deletes them next);
        the new table version. TableError on failure."""
        from deltalake.transaction import CommitProperties, RemoveAction

        now = int(time.time() * 1000)
        actions = [RemoveAction(f.path, False, now, f.bytes or None, partition_values(f.path)) for f in files]
        try:
            table = self._delta()
        except (OSError, deltalake.exceptions.DeltaError) as exc:
            raise TableError(f"{self.uri}: reading the Delta log: {_text(exc)}") from None
        return self._write(table, actions, CommitProperties(max_commit_retries=MAX_COMMIT_RETRIES))

    def listed(self) -> set[str]:
        """Paths of the files the table lists at its newest version (relative to the landing root)."""
        try:
            uris = self._delta().file_uris()
        except (OSError, deltalake.exceptions.DeltaError) as exc:
            raise TableError(f"{self.uri}: reading the Delta log: {_text(exc)}") from None
        root = self.uri.rstrip("/") + "/"
        return {uri[len(root) :] if uri.startswith(root) else uri for uri in uris}

    def _write(self, table: deltalake.DeltaTable, actions: list[Any], props: Any) -> int:
        from deltalake.transaction import PostCommitHookProperties

        if self._schema is None:
            self._schema = table_schema()
        before = table.version()
        cleanup = self.cleanup_every_commit or self._checkpoint_due(before + 1)
        try:
            table.create_write_transaction(
                actions,
                "append",
                self._schema,
                partition_by=list(PARTITION_BY),
                commit_properties=props,
                post_commithook_properties=PostCommitHookProperties(cleanup_expired_logs=cleanup),
            )
        except deltalake.exceptions.CommitFailedError as exc:
            if _is_concurrent(exc):
                raise StaleCommit(f"{self.uri}: {_text(exc)}") from None
            raise TableError(f"{self.uri}: commit failed: {_text(exc)}") from None
        except (OSError, deltalake.exceptions.DeltaError) as exc:
            raise TableError(f"{self.uri}: commit failed: {_text(exc)}") from None
        # delta-rs 1.6 leaves the table object at the version it read: read the commit (one log
        # entry) so the version returned is the commit's, not the one before it
        try:
            table.update_incremental()
        except (OSError, deltalake.exceptions.DeltaError):
            self._table = None  # committed; the next read loads the log afresh
            return before + 1
        return table.version()
