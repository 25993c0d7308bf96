"""The landing's lifecycle: delete (or archive) landed files once every Spark query reading the
landing has committed them, and optionally expire what no query ever reads (retention).

Spark's ``cleanSource`` cannot be used: in JSON mode two queries (main and quarantine, each with
its own checkpoint) read one landing, and ``cleanSource`` lets the first one delete what the other
has not read. So every query that reads the landing keeps a small record in the landing::

    _lifecycle/queries/<query name>.json   {"query", "checkpoint", "batch", "committed": {"t/p": n}}
    _lifecycle/cleaned.json                {"t/p": n}: the cleaner's progress (a hint only)

``committed[chain] = n`` says: the first ``n`` files of the chain's manifest (``LandingStore.manifest``,
the same order the s3 source counts in) are in this query's output, by its checkpoint. The job
registers its queries at start (an empty record: it holds everything back) and rewrites a record
from the query's checkpoint after batches commit (``checkpoint_committed``): Spark writes
``commits/<b>`` only after the sink committed batch ``b``, so what the checkpoint reports as
committed is in the table and a restart never reads it again.

Why this is never early: a record only ever counts files of batches with a ``commits/`` entry; for
the file source a chain's count is the longest manifest prefix whose every file is in such a batch
(a gap holds the rest back); the cleaner deletes a chain's files below the minimum count over every
registered record, so a registered query that is stopped, slow or has never run holds everything
back; with no query registered, nothing is deleted. Each chain's newest file is always kept: the s3
source tells "not visible yet" from "deleted" by looking at the newest file only. A deleted file
stays in the manifest (claims and archives are kept; the cleaner then compacts the chain, whose
floor keeps removed claims from being re-created), so the s3 source's counts stay stable positions,
and Spark's file source remembers the files it read in its own source log.

The cleaner reads the chains read-only and incrementally (chain_reader.py): a pass lists and reads
only the claims after the last one it read, so it costs O(chains + new claims), and it compacts a
chain only once more than ``KEEP_CLAIMS`` claims are above its floor. A chain's newest claim whose
file is not visible yet is not counted (the publisher completes it).

Retention (``landing.lifecycle.retention``) deletes files older than it whether or not a query
committed them: a deliberate data-loss setting, off by default; every such file is counted
(``expired``) and logged. A query that has not read an expired file yet fails on it (s3 source) or
never sees it (file source).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import structlog

from mqd import metrics
from mqd.landing import layout
from mqd.landing.chain_reader import ChainReader
from mqd.landing.delta_log import DELTA_LOG, LandingTable, storage_options, table_uri
from mqd.landing.errors import LandingCorrupt, LifecycleConflict
from mqd.landing.layout import FileRange
from mqd.landing.store import LandingStore

log = structlog.get_logger("mqd.landing")

LIFECYCLE_DIR = "_lifecycle"
QUERIES_PREFIX = f"{LIFECYCLE_DIR}/queries/"
CLEANED_KEY = f"{LIFECYCLE_DIR}/cleaned.json"
KEEP_CLAIMS = 64  # claims kept above a chain's floor after a clean (bounds each reader's GETs)
_BATCH = re.compile(r"^(\d+)(\.compact)?$")
_QUERY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def chain_key(topic: str, partition: int) -> str:
    """A chain's key in the records (the s3 source's offset key: landing_source.chain_id)."""
    return f"{topic}/{partition}"


@dataclass(frozen=True, slots=True)
class QueryRecord:
    """What one query has committed: ``committed[chain]`` manifest files per chain."""

    query: str
    committed: dict[str, int] = field(default_factory=dict)
    batch: int | None = None  # the last committed batch id it was read at
    checkpoint: str = ""
    updated: str = ""

    def to_bytes(self) -> bytes:
        d = {
            "version": 1,
            "query": self.query,
            "checkpoint": self.checkpoint,
            "batch": self.batch,
            "committed": self.committed,
            "updated": self.updated,
        }
        return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> QueryRecord:
        try:
            d = json.loads(data)
            return cls(
                query=str(d["query"]),
                committed={str(k): int(v) for k, v in dict(d.get("committed") or {}).items()},
                batch=None if d.get("batch") is None else int(d["batch"]),
                checkpoint=str(d.get("checkpoint", "")),
                updated=str(d.get("updated", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LandingCorrupt(f"{where}: unreadable lifecycle record ({exc})") from None


@dataclass(frozen=True, slots=True)
class CleanResult:
    """One clean: files deleted (or archived) as committed by every query, expired by retention,
    claims compacted, and the registered queries that held files back."""

    deleted: int = 0
    archived: int = 0
    expired: int = 0
    compacted: int = 0
    queries: tuple[str, ...] = ()


def _query_key(name: str) -> str:
    if not _QUERY_NAME.match(name):
        raise ValueError(f"not a query name: {name!r}")
    return f"{QUERIES_PREFIX}{name}.json"


# -- the registry -----------------------------------------------------------------------------------


def register(store: LandingStore, query: str, checkpoint: str = "") -> None:
    """Register ``query`` (create-only: an existing record and its progress are kept). From now
    on the cleaner deletes nothing this query has not committed. LifecycleConflict when the name
    is registered with another checkpoint (two tables of one name reading one landing)."""
    from mqd.landing.errors import PreconditionFailed

    key = _query_key(query)
    rec = QueryRecord(query, checkpoint=checkpoint, updated=layout.iso_now())
    try:
        store.objects.put(key, rec.to_bytes(), if_absent=True)
        log.info("lifecycle query registered", query=query, landing=store.location)
        return
    except PreconditionFailed:
        pass
    got = store.objects.get(key)
    old = QueryRecord.from_bytes(got[0], f"{store.location}/{key}") if got else None
    if old is not None and old.checkpoint and checkpoint and old.checkpoint != checkpoint:
        raise LifecycleConflict(
            f"{store.location}/{key}: query {query} is registered with checkpoint {old.checkpoint}, "
            f"not {checkpoint}; give the table another name or `mqd landing clean --deregister {query}`"
        )


def deregister(store: LandingStore, query: str) -> bool:
    """Remove ``query``'s record (it no longer holds files back); False when it had none."""
    key = _query_key(query)
    if store.objects.head(key) is None:
        return False
    store.objects.delete(key)
    log.warning("lifecycle query deregistered", query=query, landing=store.location)
    return True


def records(store: LandingStore) -> dict[str, QueryRecord]:
    """Every registered query's record, by name."""
    out: dict[str, QueryRecord] = {}
    for info in store.objects.list_objects(QUERIES_PREFIX):
        got = store.objects.get(info.key)
        if got is None:
            continue  # deregistered meanwhile
        rec = QueryRecord.from_bytes(got[0], f"{store.location}/{info.key}")
        out[rec.query] = rec
    return out


def record_committed(
    store: LandingStore, query: str, committed: Mapping[str, int], batch: int | None, checkpoint: str = ""
) -> None:
    """Rewrite ``query``'s record (one writer per query: its job)."""
    rec = QueryRecord(query, dict(committed), batch, checkpoint, layout.iso_now())
    store.objects.put(_query_key(query), rec.to_bytes())


# -- reading a Spark checkpoint (no Spark needed) ---------------------------------------------------


def _batch_files(folder: Path) -> list[tuple[int, Path]]:
    """(batch id, file) of a checkpoint log folder, in batch order; Spark's ``.crc`` and temp
    files (hidden) are not log entries."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        m = _BATCH.match(n)
        if m:
            out.append((int(m.group(1)), folder / n))
    return sorted(out)


def last_committed_batch(checkpoint: Path) -> int | None:
    """The highest batch id with a ``commits/`` entry: Spark writes it after the sink committed."""
    files = _batch_files(Path(checkpoint) / "commits")
    return files[-1][0] if files else None


def _log_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("v"):
        raise LandingCorrupt(f"{path}: not a Spark checkpoint log file")
    return lines[1:]


def committed_source_files(checkpoint: Path, batch: int) -> set[str]:
    """Spark's file source: the paths (as written in its source log ``sources/0``) of every file
    in a batch up to ``batch``. Compacted entries (``<b>.compact``) hold the earlier batches."""
    out: set[str] = set()
    for _b, path in _batch_files(Path(checkpoint) / "sources" / "0"):
        for line in _log_lines(path):
            if not line.strip():
                continue
            d = json.loads(line)
            if int(d.get("batchId", 0)) <= batch:
                out.add(str(d["path"]))
    return out


def committed_offset(checkpoint: Path, batch: int) -> dict[str, int]:
    """The s3 source (landing_source): its end offset of batch ``batch`` (``offsets/<batch>``,
    the one source's line), ``{"t/p": n}``: the first n manifest files of each chain."""
    lines = _log_lines(Path(checkpoint) / "offsets" / str(batch))
    if len(lines) < 2:
        raise LandingCorrupt(f"{checkpoint}/offsets/{batch}: no source offset")
    raw = json.loads(lines[1])
    if isinstance(raw, str):  # a source offset serialised as a JSON string
        raw = json.loads(raw)
    return {str(k): int(v) for k, v in dict(raw).items()}


def relative_path(uri: str, root: Path) -> str | None:
    """A file source log path (``file:///...``) relative to the landing ``root``; None outside it."""
    p = urlparse(uri)
    path = Path(unquote(p.path)) if p.scheme in ("file", "") else None
    if path is None:
        return None
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return None


def prefix_counts(chains: Mapping[str, Sequence[FileRange]], done: set[str]) -> dict[str, int]:
    """Per chain, the longest prefix of its files whose every path is in ``done`` (a gap holds
    the rest of the chain back: never early)."""
    out: dict[str, int] = {}
    for k, files in chains.items():
        n = 0
        for f in files:
            if f.path not in done:
                break
            n += 1
        out[k] = n
    return out


def manifest_chains(store: LandingStore, reader: ChainReader | None = None) -> dict[str, list[FileRange]]:
    """Every chain's visible files in chain order (the manifest's order; the s3 source counts in
    it), read-only (chain_reader.py); ``reader``: one kept across calls reads only what is new."""
    reader = reader if reader is not None else ChainReader(store.objects)
    return {chain_key(t, p): files for (t, p), files in reader.files().items()}


def checkpoint_committed(
    store: LandingStore,
    checkpoint: Path,
    *,
    file_source_root: Path | None,
    reader: ChainReader | None = None,
) -> tuple[int | None, dict[str, int]]:
    """(last committed batch, committed counts) of a query's checkpoint: from its source log
    (Spark's file source on the local landing ``file_source_root``) or from its offset log (the
    s3 source). (None, {}) before the first committed batch. ``reader``: one kept across calls
    reads only the claims that are new since the last call."""
    batch = last_committed_batch(checkpoint)
    if batch is None:
        return None, {}
    if file_source_root is None:
        return batch, committed_offset(checkpoint, batch)
    done: set[str] = set()
    for uri in committed_source_files(checkpoint, batch):
        rel = relative_path(uri, file_source_root)
        if rel is not None:
            done.add(rel)
    return batch, prefix_counts(manifest_chains(store, reader), done)


# -- the cleaner ------------------------------------------------------------------------------------


def _age_ms(created: str, now_ms: int) -> int | None:
    try:
        return now_ms - int(datetime.fromisoformat(created).timestamp() * 1000)
    except ValueError:
        return None


class Cleaner:
    """Deletes (or moves under ``archive_dir``) landed files every registered query committed;
    with ``retention_ms``, also files older than it (module docstring). Blocking; run it on a
    worker thread. Counters are totals over this object's life."""

    def __init__(
        self,
        store: LandingStore,
        *,
        archive_dir: str | None = None,
        retention_ms: int | None = None,
        table: LandingTable | None = None,
    ) -> None:
        self.store = store
        self.archive_dir = archive_dir.strip("/") if archive_dir else None
        self.retention_ms = retention_ms
        self.deleted = 0
        self.archived = 0
        self.expired = 0
        self.removed_from_table = 0
        self.reader = ChainReader(store.objects)  # remembers each chain's last claim read
        # the landing's Delta table (landing.table = "delta"); found by its log when not given, so
        # `mqd landing clean` keeps a table it was not told about whole
        self.table = table

    def _landing_table(self) -> LandingTable | None:
        """The landing's Delta table, loaded at its newest version; None when the landing has none."""
        if self.table is None:
            if not any(True for _ in self.store.objects.list_objects(f"{DELTA_LOG}/")):
                return None
            self.table = LandingTable(
                table_uri(self.store.location), self.store.objects, storage=self._storage()
            )
        return self.table if self.table.load(create=False) else None

    def _storage(self) -> dict[str, str] | None:
        objects = self.store.objects
        client = getattr(objects, "client", None)
        if client is None:
            return None
        return storage_options(self.store.location, client.meta.endpoint_url, client.meta.region_name)

    def clean(self, now_ms: int | None = None) -> CleanResult:
        now = now_ms if now_ms is not None else int(time.time() * 1000)
        recs = records(self.store)
        views = self.reader.refresh()
        chains = {chain_key(t, p): v.files for (t, p), v in views.items()}
        got = self.store.objects.get(CLEANED_KEY)
        cleaned: dict[str, int] = {str(k): int(v) for k, v in json.loads(got[0]).items()} if got else {}
        deleted = archived = expired = compacted = 0
        table = self._landing_table()
        going: list[tuple[str, int, FileRange, bool]] = []  # (chain, index, file, expired), chain order
        visited: list[str] = []
        for k, files in sorted(chains.items()):
            if not files:
                continue  # its first file is not visible yet (a pending promotion): nothing to clean
            visited.append(k)
            # every registered query's count; none registered: nothing is committed by "every" query
            committed = min((r.committed.get(k, 0) for r in recs.values()), default=0)
            last = len(files) - 1  # the newest file stays (module docstring)
            start = min(cleaned.get(k, 0), last)
            done = start
            for i in range(start, max(last, 0)):
                f = files[i]
                if table is not None and not table.committed(f):
                    break  # the table is a reader too: not in it yet, so not gone from the landing
                if i < committed:
                    going.append((k, i, f, False))
                elif self.retention_ms is not None and (_age_ms(f.created, now) or -1) > self.retention_ms:
                    going.append((k, i, f, True))
                else:
                    break
                done = i + 1
            cleaned[k] = done
        if table is not None and going:
            # removed from the table (dataChange=false) before any is deleted: never deleted while
            # the table lists it; a crash between the two leaves files the next pass deletes
            listed = table.listed()
            gone_from_table = [f for _k, _i, f, _e in going if f.path in listed]
            if gone_from_table:
                version = table.remove(gone_from_table)
                self.removed_from_table += len(gone_from_table)
                metrics.landing_table_files_removed.inc(len(gone_from_table))
                log.info(
                    "landing table: files removed before deletion",
                    files=len(gone_from_table),
                    version=version,
                )
        for k, i, f, is_expired in going:
            if not is_expired:
                if self._remove(f):
                    if self.archive_dir:
                        archived += 1
                    else:
                        deleted += 1
            elif self.store.objects.head(f.path) is not None:
                self.store.objects.delete(f.path)
                expired += 1
                log.warning(
                    "landed file expired by landing.lifecycle.retention before every query "
                    "committed it: its records are not in every table",
                    path=f.path,
                    created=f.created,
                    queries_behind=sorted(q for q, r in recs.items() if r.committed.get(k, 0) <= i),
                )
        for k in visited:
            topic, _, part = k.rpartition("/")
            if views[(topic, int(part))].claims_above_floor > KEEP_CLAIMS:  # else nothing to compact
                compacted += self.store.compact(topic, int(part), KEEP_CLAIMS)
        if chains:
            self.store.objects.put(CLEANED_KEY, json.dumps(cleaned, sort_keys=True).encode())
        self.deleted += deleted
        self.archived += archived
        self.expired += expired
        result = CleanResult(deleted, archived, expired, compacted, tuple(sorted(recs)))
        if deleted or archived or expired or compacted:
            log.info(
                "landing cleaned",
                deleted=deleted,
                archived=archived,
                expired=expired,
                claims_compacted=compacted,
                queries=list(result.queries),
            )
        return result

    def _remove(self, f: FileRange) -> bool:
        """Delete (or archive) one committed file; False when it was gone already."""
        if self.store.objects.head(f.path) is None:
            return False
        if self.archive_dir and not self.store.objects.copy(f.path, f"{self.archive_dir}/{f.path}"):
            return False
        self.store.objects.delete(f.path)
        return True


def describe(recs: Iterable[QueryRecord]) -> list[dict[str, Any]]:
    """The records as JSON-able rows (``mqd landing clean --list``)."""
    return [
        {"query": r.query, "batch": r.batch, "files": sum(r.committed.values()), "updated": r.updated}
        for r in sorted(recs, key=lambda r: r.query)
    ]
