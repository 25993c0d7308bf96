"""The local store: the landing's publication protocol on a POSIX directory (store.py's first
implementation). Blocking code: it runs on the sink's worker threads, or in tools.

Publishing one file of (topic, partition):

1. ``stage``: encode the records into a hidden temp file in the target folder and fsync it (no
   lock held);
2. ``commit``: take ``fcntl.flock`` on ``_state/<t>/<p>.lock`` (cross-process), read the state and
   finish any publication a crashed process left half done (see ``pending`` below);
3. check the condition: the state's last published (incarnation, offset) is the one the publisher
   expects (the end it resumed after, or its own last publication) and the new range starts after
   it, or belongs to another incarnation of the log (whose offsets start again where it diverged).
   Otherwise another owner published in between: ``PublishConflict`` (the caller drops its batch
   and re-seeks after ``PublishConflict.last_offset``);
4. record the intent (``pending``) in the state file, ``os.link`` the temp file to its final name
   (exclusive: EEXIST is a conflict too), unlink the temp name, fsync the folder;
5. append the manifest line, write the state with the new last offset, release the lock.

The link is the commit point. A crash after it and before the state update leaves ``pending`` in
the state; whoever takes the lock next sees that the final file exists and completes step 5.

Format: ``open`` writes ``_format.json`` (version 2, with log incarnations) in a new landing and
refuses a landing of another format (LandingFormatError naming the migration command);
``migrate`` turns a format-1 landing into format 2. A format-1 daemon cannot publish into a
format-2 partition: the state records are version 2, which its reader refuses (LandingCorrupt), and
a format-2 daemon writes a state record for every partition it resolves, published or not.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog

from mqd import fsutil, metrics
from mqd.landing import layout, watermark
from mqd.landing.layout import FileRange, LandingCorrupt, LandingError, LandingFormatError
from mqd.landing.store import (
    STALE_AFTER_S,
    CommitLockTimeout,
    PartitionHead,
    PublishConflict,
    StagedFile,
)
from mqd.topic_name import check_topic_name

_STATE_VERSION = 2  # 2: with the incarnation of the last published offset (landing format 2)
# a commit holds its partition's lock for a link, a manifest line and a state write (milliseconds);
# waiting longer means the holder is frozen (a stopped VM, SIGSTOP): give up, keep the batch, retry
COMMIT_LOCK_TIMEOUT_S = 5.0

log = structlog.get_logger("mqd.landing.local_store")


@dataclass(slots=True)
class PartitionState:
    """``_state/<t>/<p>.json``: rebuildable from the manifest or the files' metadata."""

    last_offset: int | None = None
    watermark_ms: int | None = None  # every record below this event time is published (or none exists)
    files: int = 0
    pending: FileRange | None = None
    incarnation: str | None = None  # of last_offset; None: unknown (landed before incarnations)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "incarnation": self.incarnation,
            "last_offset": self.last_offset,
            "watermark_ms": self.watermark_ms,
            "files": self.files,
            "pending": self.pending.to_json() if self.pending else None,
            "updated": layout.iso_now(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionState:
        version = d.get("version")
        if version == 1:
            raise LandingFormatError(
                f"a format-1 state record (written by an mqd before log incarnations); "
                f"stop that daemon and migrate the landing: {layout.MIGRATE_COMMAND}"
            )
        if version != _STATE_VERSION:
            raise LandingCorrupt(f"unknown state version {version!r}")
        pending = d.get("pending")
        return cls(
            last_offset=None if d.get("last_offset") is None else int(d["last_offset"]),
            watermark_ms=None if d.get("watermark_ms") is None else int(d["watermark_ms"]),
            files=int(d.get("files", 0)),
            pending=FileRange.from_json(pending) if pending else None,
            incarnation=layout.check_incarnation(d.get("incarnation")),
        )


def _landing_error(exc: OSError, what: str) -> LandingError:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return LandingError(f"{what}: {name}: {exc.strerror or exc}", errno=exc.errno)


class LocalStore:
    """The landing in one local (or shared POSIX) directory. Thread-compatible per partition: the
    flock serialises committers of one partition across threads and processes."""

    def __init__(
        self,
        root: Path,
        *,
        head_lock_timeout: float | None = None,
        commit_lock_timeout: float = COMMIT_LOCK_TIMEOUT_S,
        max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS,
    ) -> None:
        self.root = Path(root)
        # how long ``head`` waits for a partition's lock (None: as long as it takes). A holder
        # frozen inside a commit (a stopped VM, SIGSTOP) must not stall a new owner's start
        # position for as long as it is frozen: fsutil.LockTimeout (retriable) instead.
        self.head_lock_timeout = head_lock_timeout
        # the same for ``commit`` and ``advance_watermark``: the publisher and the idle-watermark
        # round retry later instead of waiting as long as the holder is frozen
        self.commit_lock_timeout = commit_lock_timeout
        self.max_event_ahead_ms = max_event_ahead_ms  # the watermark's trust in event times (watermark.py)

    @property
    def location(self) -> str:
        return str(self.root)

    # -- paths ----------------------------------------------------------------------------------

    def _state_path(self, topic: str, partition: int) -> Path:
        return self.root / layout.topic_state_dir(topic) / f"{partition:05d}.json"

    def _lock_path(self, topic: str, partition: int) -> Path:
        return self.root / layout.topic_state_dir(topic) / f"{partition:05d}.lock"

    def _manifest_dir(self, topic: str, partition: int) -> Path:
        return self.root / layout.topic_manifest_dir(topic) / f"{partition:05d}"

    def _manifest_path(self, topic: str, partition: int, created: str) -> Path:
        """One manifest file per partition and UTC day of publication, so recovery reads a day."""
        day = created[:10] if len(created) >= 10 else layout.iso_now()[:10]
        return self._manifest_dir(topic, partition) / f"{day}.jsonl"

    def open(self) -> None:
        self._check_format()
        try:
            for d in (self.root, self.root / layout.STATE_DIR, self.root / layout.MANIFEST_DIR):
                d.mkdir(parents=True, exist_ok=True)
            probe = self.root / layout.STATE_DIR / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b"probe")
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as exc:
            raise _landing_error(exc, f"landing directory {self.root} is not writable") from None

    def _check_format(self) -> None:
        """Write the format marker into a new landing; refuse a landing of another format."""
        path = self.root / layout.FORMAT_FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if _has_landed(self.root):
                raise LandingFormatError(
                    f"{self.root}: landing format 1 (landed before log incarnations); this mqd "
                    f"writes format {layout.FORMAT_VERSION}. Stop every daemon of this landing, "
                    f"then migrate it: {layout.MIGRATE_COMMAND}"
                ) from None
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                layout.write_atomic(path, _format_json())
            except OSError as exc:
                raise _landing_error(exc, f"landing directory {self.root} is not writable") from None
            return
        except OSError as exc:
            raise _landing_error(exc, f"landing directory {self.root} is not writable") from None
        version = read_format(data, path)
        if version < layout.FORMAT_VERSION:
            raise LandingFormatError(
                f"{self.root}: landing format {version}; this mqd writes format "
                f"{layout.FORMAT_VERSION}. Migrate it: {layout.MIGRATE_COMMAND}"
            )
        if version > layout.FORMAT_VERSION:
            raise LandingFormatError(
                f"{self.root}: landing format {version} was written by a newer mqd (this one "
                f"writes format {layout.FORMAT_VERSION}); upgrade this daemon"
            )

    def remove_stale(self, older_than_s: float = STALE_AFTER_S) -> int:
        """Delete temp files that crashed publishers left in hour folders (by age, not by pid:
        several hosts may share the directory, where pids say nothing)."""
        removed = 0
        cutoff = time.time() - older_than_s
        for path in self.root.glob("topic=*/dt=*/hour=*/.part-*.tmp"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed

    def _locked(
        self, topic: str, partition: int, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        return fsutil.locked(self._lock_path(topic, partition), timeout=timeout)

    @contextlib.contextmanager
    def _write_locked(self, topic: str, partition: int, what: str) -> Iterator[None]:
        """The partition's lock for a write, bounded by ``commit_lock_timeout``, so a frozen holder
        stalls no caller beyond it: a held lock is counted and logged with the partition, then
        raised as fsutil.LockTimeout (retriable), or for a commit as CommitLockTimeout (a
        LandingError: the publisher keeps its batch and tries again)."""
        try:
            with self._locked(topic, partition, self.commit_lock_timeout):
                yield
        except fsutil.LockTimeout as exc:
            metrics.landing_lock_timeouts.labels(what).inc()
            log.warning(
                "landing lock held by another process; retried later",
                topic=topic,
                partition=partition,
                operation=what,
                timeout_s=self.commit_lock_timeout,
            )
            if what == "commit":
                raise CommitLockTimeout(f"{topic}/{partition}: {what}: {exc}") from None
            raise

    # -- state ----------------------------------------------------------------------------------

    def _read_state(self, topic: str, partition: int) -> PartitionState:
        path = self._state_path(topic, partition)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            st = self._rebuild_state(topic, partition)
            # also when nothing is published: a format-1 daemon refuses a version-2 state record,
            # so it can never publish into a partition a format-2 daemon has resolved
            self._write_state(topic, partition, st)
            return st
        try:
            return PartitionState.from_json(json.loads(data))
        except LandingFormatError as exc:
            raise LandingFormatError(f"{path}: {exc}") from None
        except (ValueError, LandingCorrupt) as exc:
            raise LandingCorrupt(
                f"{path}: unreadable partition state ({exc}); delete it to rebuild"
            ) from None

    def _write_state(self, topic: str, partition: int, st: PartitionState) -> None:
        path = self._state_path(topic, partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        layout.write_atomic(path, json.dumps(st.to_json()).encode())

    def _rebuild_state(self, topic: str, partition: int) -> PartitionState:
        """State from the manifest, or, when that is gone too, from the data files' metadata."""
        ranges = self._manifest_ranges(topic, partition)
        if not ranges:
            ranges = self._scan_files(topic, partition)
            if ranges:
                mpath = self._manifest_path(topic, partition, layout.iso_now())
                mpath.parent.mkdir(parents=True, exist_ok=True)
                layout.write_atomic(mpath, b"".join(_manifest_line(r) for r in ranges))
        if not ranges:
            return PartitionState()
        # the last publication is the head: offsets restart when the log's incarnation changes
        last = ranges[-1]
        if all(r.incarnation is None for r in ranges):
            last = max(ranges, key=lambda r: r.last_offset)  # format-1 files: one log, offsets only grow
        mark: int | None = None
        for r in ranges:
            mark = watermark.watermark_after(mark, r, self.max_event_ahead_ms)
        return PartitionState(
            last_offset=last.last_offset,
            watermark_ms=mark,
            files=len(ranges),
            incarnation=last.incarnation,
        )

    def _scan_files(self, topic: str, partition: int) -> list[FileRange]:
        out: list[FileRange] = []
        pattern = f"dt=*/hour=*/part-{partition:05d}-*.parquet"
        for path in sorted((self.root / layout.topic_dir(topic)).glob(pattern)):
            try:
                ranges = layout.read_ranges(path)
            except LandingCorrupt:
                continue  # a foreign file with our naming: not ours to count
            out.extend(r for r in ranges if r.topic == topic and r.partition == partition)
        # publication order: a file's creation time (format 2 records it before it is written)
        return sorted(out, key=lambda r: (r.created, r.first_offset))

    def _recover(self, topic: str, partition: int, st: PartitionState) -> PartitionState:
        """Finish a publication whose process died between the link and the state update."""
        if st.pending is None:
            return st
        rng = st.pending
        if (self.root / rng.path).exists():
            mpath = self._manifest_path(topic, partition, rng.created)
            tail = read_manifest_file(mpath)[-1:]
            if not tail or tail[0].path != rng.path:
                self._append_manifest(mpath, rng)
            st = PartitionState(
                last_offset=rng.last_offset,
                watermark_ms=watermark.watermark_after(st.watermark_ms, rng, self.max_event_ahead_ms),
                files=st.files + 1,
                incarnation=rng.incarnation,
            )
        else:
            st = replace(st, pending=None)
        self._write_state(topic, partition, st)
        return st

    def state(self, topic: str, partition: int, timeout: float | None = None) -> PartitionState:
        """The partition's state record, with any half-done publication completed. ``timeout``
        bounds the wait for the partition's lock (fsutil.LockTimeout, retriable)."""
        try:
            with self._locked(topic, partition, timeout):
                return self._recover(topic, partition, self._read_state(topic, partition))
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: reading landing state") from None

    def head(self, topic: str, partition: int) -> PartitionHead:
        st = self.state(topic, partition, self.head_lock_timeout)
        return PartitionHead(st.last_offset, st.watermark_ms, st.files, st.incarnation)

    def advance_watermark(self, topic: str, partition: int, watermark_ms: int) -> None:
        try:
            with self._write_locked(topic, partition, "watermark"):
                st = self._recover(topic, partition, self._read_state(topic, partition))
                if st.watermark_ms is None or watermark_ms > st.watermark_ms:
                    st.watermark_ms = watermark_ms
                    self._write_state(topic, partition, st)
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: writing landing state") from None

    def watermarks(self, topic: str, partitions: int) -> list[int | None]:
        from mqd.landing import markers  # markers reads this module's state records

        return markers.read_watermarks(self.root, topic, partitions)

    def update_markers(self, topic: str, partitions: int) -> list[str]:
        from mqd.landing import markers

        return [str(p) for p in markers.update_markers(self.root, topic, partitions)]

    # -- manifest -------------------------------------------------------------------------------

    def _append_manifest(self, path: Path, rng: FileRange) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = _manifest_line(rng)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    line = b"\n" + line  # a torn line from a crash: never glue onto it
        layout.append_line(path, line)

    def _manifest_ranges(self, topic: str, partition: int) -> list[FileRange]:
        out: list[FileRange] = []
        for path in sorted(self._manifest_dir(topic, partition).glob("*.jsonl")):
            out.extend(read_manifest_file(path))
        return out

    def manifest(self, topic: str | None = None) -> list[FileRange]:
        return read_manifest(self.root, topic)

    def visible_files(self) -> list[str]:
        """Files outside ``_``/``.`` paths (what Spark's file source lists), data or not."""
        out: list[str] = []
        if not self.root.is_dir():
            return out
        for path in self.root.rglob("*"):
            rel = path.relative_to(self.root)
            if any(part.startswith(("_", ".")) for part in rel.parts) or not path.is_file():
                continue
            out.append(rel.as_posix())
        return sorted(out)

    # -- publication ----------------------------------------------------------------------------

    def stage(self, records: pa.Table, rng: FileRange, compression: str) -> StagedFile:
        """A hidden temp file next to the final name, fsynced: the link in commit() stays in one
        folder (one filesystem), and Spark ignores dot files."""
        final_dir = self.root / rng.path.rsplit("/", 1)[0]
        name = rng.path.rsplit("/", 1)[1]
        tmp = final_dir / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        # the creation time goes into the file's metadata too: it orders a rebuild from the files
        rng = replace(rng, created=layout.iso_now())
        try:
            layout.makedirs_durable(final_dir, self.root)
            size = layout.write_parquet(tmp, records, rng, compression)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise _landing_error(exc, f"{rng.topic}/{rng.partition}: publishing {rng.path}") from None
        return StagedFile(replace(rng, bytes=size), str(tmp))

    def discard(self, staged: StagedFile) -> None:
        with contextlib.suppress(OSError):
            Path(staged.location).unlink(missing_ok=True)

    def commit(
        self, staged: StagedFile, expected_last: int | None, expected_incarnation: str | None = None
    ) -> FileRange:
        rng = staged.range
        topic, partition = rng.topic, rng.partition
        tmp = Path(staged.location)
        final = self.root / rng.path
        try:
            with self._write_locked(topic, partition, "commit"):
                st = self._recover(topic, partition, self._read_state(topic, partition))
                if not publishable(st, rng, expected_last, expected_incarnation):
                    raise PublishConflict(
                        topic, partition, expected_last, st.last_offset, incarnation=st.incarnation
                    )
                st.pending = rng
                self._write_state(topic, partition, st)
                try:
                    os.link(tmp, final)
                except FileExistsError:
                    st.pending = None
                    self._write_state(topic, partition, st)
                    # the state lagged the files (rebuilt from an old manifest): repair, then lose.
                    # read_ranges raises LandingCorrupt when a foreign file squats on the name.
                    existing = layout.read_ranges(final)
                    newest = max(existing, key=lambda r: r.last_offset, default=None)
                    if newest is not None and (st.last_offset is None or newest.last_offset > st.last_offset):
                        st.last_offset, st.incarnation = newest.last_offset, newest.incarnation
                    self._write_state(topic, partition, st)
                    raise PublishConflict(
                        topic, partition, expected_last, st.last_offset, incarnation=st.incarnation
                    ) from None
                os.unlink(tmp)
                layout.fsync_dir(final.parent)
                self._append_manifest(self._manifest_path(topic, partition, rng.created), rng)
                st = PartitionState(
                    last_offset=rng.last_offset,
                    watermark_ms=watermark.watermark_after(st.watermark_ms, rng, self.max_event_ahead_ms),
                    files=st.files + 1,
                    incarnation=rng.incarnation,
                )
                self._write_state(topic, partition, st)
            return rng
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: publishing {rng.path}") from None


def publishable(
    st: PartitionState, rng: FileRange, expected_last: int | None, expected_inc: str | None
) -> bool:
    """The commit condition: the landed end is the one the publisher expects, and the range
    follows it: after it in the same incarnation, or anywhere in another known incarnation (the
    new log reuses offsets from where it diverged; its records are new records). An unknown
    landed incarnation (format-1 files) assumes no reuse: the range must start after it."""
    if st.last_offset is None:
        return True  # nothing was ever published, so nothing can be duplicated
    if st.last_offset != expected_last or st.incarnation != expected_inc:
        return False
    if rng.first_offset > st.last_offset:
        return True
    return st.incarnation is not None and rng.incarnation is not None and rng.incarnation != st.incarnation


def _format_json() -> bytes:
    return json.dumps({"format": layout.FORMAT_VERSION, "created": layout.iso_now()}).encode()


def read_format(data: bytes, path: Path) -> int:
    """The version in a ``_format.json``; LandingCorrupt when it is not one."""
    try:
        version = json.loads(data)["format"]
    except (ValueError, KeyError, TypeError):
        raise LandingCorrupt(f"{path}: unreadable landing format marker") from None
    if isinstance(version, bool) or not isinstance(version, int):
        raise LandingCorrupt(f"{path}: unreadable landing format marker")
    return version


def _has_landed(root: Path) -> bool:
    """Something was published (or resolved) here already: state records, manifests or data."""
    for name in (layout.STATE_DIR, layout.MANIFEST_DIR):
        d = root / name
        if d.is_dir() and any(p.name.endswith((".json", ".jsonl")) for p in d.rglob("*")):
            return True
    return root.is_dir() and any(root.glob("topic=*/dt=*/hour=*/part-*.parquet"))


def _manifest_line(rng: FileRange) -> bytes:
    return json.dumps(rng.to_json(), separators=(",", ":")).encode() + b"\n"


def read_manifest_file(path: Path) -> list[FileRange]:
    """Ranges in one manifest file; a torn last line (crash mid-append) is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[FileRange] = []
    seen: set[str] = set()
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            rng = FileRange.from_json(json.loads(raw))
        except (ValueError, LandingCorrupt):
            continue
        if rng.path not in seen:
            seen.add(rng.path)
            out.append(rng)
    return out


def read_manifest(root: Path, topic: str | None = None) -> list[FileRange]:
    """Every published file in a landing directory (for tools and the Spark job)."""
    base = Path(root) / layout.MANIFEST_DIR
    pattern = "*/*/*.jsonl" if topic is None else f"{check_topic_name(topic)}/*/*.jsonl"
    out: list[FileRange] = []
    for path in sorted(base.glob(pattern)):
        out.extend(read_manifest_file(path))
    return out


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``migrate`` did."""

    from_version: int
    to_version: int
    states: int  # partition state records rewritten


def migrate(root: Path) -> Migration:
    """Turn a format-1 landing (before log incarnations) into format 2, in place: every partition
    state record becomes version 2 with an unknown incarnation (files landed before keep their
    names and have no incarnation; the first fetch answer's incarnation is adopted without assuming
    any reuse, which is what format 1 did), then the format marker is written, last, so an
    interrupted migration is simply run again. Every daemon of the landing must be stopped.
    Idempotent; LandingFormatError for a landing newer than this mqd."""
    root = Path(root)
    marker = root / layout.FORMAT_FILE
    if marker.exists():
        version = read_format(marker.read_bytes(), marker)
        if version > layout.FORMAT_VERSION:
            raise LandingFormatError(f"{root}: landing format {version} is newer than this mqd's")
        if version == layout.FORMAT_VERSION:
            return Migration(version, version, 0)
    states = 0
    for path in sorted((root / layout.STATE_DIR).glob("*/[0-9]*.json")):
        with fsutil.locked(path.with_suffix(".lock")):
            try:
                d = json.loads(path.read_bytes())
            except ValueError:
                raise LandingCorrupt(f"{path}: unreadable partition state; delete it to rebuild") from None
            if not isinstance(d, dict) or d.get("version") == _STATE_VERSION:
                continue
            if d.get("version") != 1:
                raise LandingCorrupt(f"{path}: unknown state version {d.get('version')!r}")
            pending = d.get("pending")
            st = PartitionState(
                last_offset=None if d.get("last_offset") is None else int(d["last_offset"]),
                watermark_ms=None if d.get("watermark_ms") is None else int(d["watermark_ms"]),
                files=int(d.get("files", 0)),
                pending=FileRange.from_json(pending) if pending else None,
                incarnation=None,
            )
            layout.write_atomic(path, json.dumps(st.to_json()).encode())
            states += 1
    root.mkdir(parents=True, exist_ok=True)
    layout.write_atomic(marker, _format_json())
    return Migration(1, layout.FORMAT_VERSION, states)
