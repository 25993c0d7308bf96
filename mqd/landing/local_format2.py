"""Format 2 of the local landing (flock + exclusive link, day manifests, ``_state`` records with the
last published offset): read, completed and converted by the migration to format 3
(local_migration.py). No daemon publishes with it any more.

Format 2 published one file of (topic, partition) so: stage a hidden temp file next to the final
name; take ``fcntl.flock`` on ``_state/<t>/<p>.lock``; check the state's last published
(incarnation, offset); record the intent (``pending``) in the state; ``os.link`` the file to its
final name (the commit point); append the manifest line (``_manifest/<t>/<p>/<day>.jsonl``); write
the state. A crash after the link left ``pending``, completed by whoever took the lock next
(:meth:`Format2Store.state` still does that, so a migration starts from a complete state).
"""

from __future__ import annotations

import contextlib
import errno
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mqd import fsutil
from mqd.landing import layout, watermark
from mqd.landing.errors import LandingCorrupt, LandingError, LandingFormatError
from mqd.landing.layout import FileRange
from mqd.topic_name import check_topic_name

STATE_VERSION = 2  # 2: with the incarnation of the last published offset (landing format 2)
MIGRATION_LOCK_TIMEOUT_S = 10.0  # a format-2 daemon still running holds a partition's lock for ms


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
            "version": STATE_VERSION,
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
        if version != STATE_VERSION:
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


class Format2Store:
    """A format-2 local landing, for the migration: state records (completed under the
    partition's flock) and manifests."""

    def __init__(self, root: Path, *, max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS) -> None:
        self.root = Path(root)
        self.max_event_ahead_ms = max_event_ahead_ms

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

    def _locked(
        self, topic: str, partition: int, timeout: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        return fsutil.locked(self._lock_path(topic, partition), timeout=timeout)

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
        ranges = self.manifest_ranges(topic, partition)
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

    def manifest_ranges(self, topic: str, partition: int) -> list[FileRange]:
        """The partition's published files, in manifest (publication) order."""
        out: list[FileRange] = []
        for path in sorted(self._manifest_dir(topic, partition).glob("*.jsonl")):
            out.extend(read_manifest_file(path))
        return out


def read_format(data: bytes, path: Path) -> int:
    """The version in a ``_format.json``; LandingCorrupt when it is not one."""
    try:
        version = json.loads(data)["format"]
    except (ValueError, KeyError, TypeError):
        raise LandingCorrupt(f"{path}: unreadable landing format marker") from None
    if isinstance(version, bool) or not isinstance(version, int):
        raise LandingCorrupt(f"{path}: unreadable landing format marker")
    return version


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
    """Every published file in a format-2 landing directory's day manifests."""
    base = Path(root) / layout.MANIFEST_DIR
    pattern = "*/*/*.jsonl" if topic is None else f"{check_topic_name(topic)}/*/*.jsonl"
    out: list[FileRange] = []
    for path in sorted(base.glob(pattern)):
        out.extend(read_manifest_file(path))
    return out


def upgrade_states_1_to_2(root: Path) -> int:
    """Rewrite every format-1 partition state record as version 2 with an unknown incarnation
    (files landed before keep their names and have no incarnation; the first fetch answer's
    incarnation is adopted without assuming any reuse, which is what format 1 did); returns how
    many. Idempotent: version-2 records are left alone, so an interrupted run is run again."""
    states = 0
    for path in sorted((Path(root) / layout.STATE_DIR).glob("*/[0-9]*.json")):
        with fsutil.locked(path.with_suffix(".lock"), timeout=MIGRATION_LOCK_TIMEOUT_S):
            try:
                d = json.loads(path.read_bytes())
            except ValueError:
                raise LandingCorrupt(f"{path}: unreadable partition state; delete it to rebuild") from None
            if not isinstance(d, dict) or d.get("version") != 1:
                continue
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
    return states
