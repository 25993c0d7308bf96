"""The local store: the landing's publication protocol on a POSIX directory (store.py's first
implementation). Blocking code: it runs on the sink's worker threads, or in tools.

Publishing one file of (topic, partition):

1. ``stage``: encode the records into a hidden temp file in the target folder and fsync it (no
   lock held);
2. ``commit``: take ``fcntl.flock`` on ``_state/<t>/<p>.lock`` (cross-process), read the state and
   finish any publication a crashed process left half done (see ``pending`` below);
3. check the condition: the state's last published offset is the one the publisher expects (the
   offset it resumed after, or its own last publication) and the new range starts after it.
   Otherwise another owner published in between: ``PublishConflict`` (the caller drops its batch
   and re-seeks after ``PublishConflict.last_offset``);
4. record the intent (``pending``) in the state file, ``os.link`` the temp file to its final name
   (exclusive: EEXIST is a conflict too), unlink the temp name, fsync the folder;
5. append the manifest line, write the state with the new last offset, release the lock.

The link is the commit point. A crash after it and before the state update leaves ``pending`` in
the state; whoever takes the lock next sees that the final file exists and completes step 5.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from mqd import fsutil
from mqd.landing import layout, watermark
from mqd.landing.layout import FileRange, LandingCorrupt, LandingError
from mqd.landing.store import STALE_AFTER_S, PartitionHead, PublishConflict, StagedFile
from mqd.topic_name import check_topic_name

_STATE_VERSION = 1


@dataclass(slots=True)
class PartitionState:
    """``_state/<t>/<p>.json``: rebuildable from the manifest or the files' metadata."""

    last_offset: int | None = None
    watermark_ms: int | None = None  # every record below this event time is published (or none exists)
    files: int = 0
    pending: FileRange | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "last_offset": self.last_offset,
            "watermark_ms": self.watermark_ms,
            "files": self.files,
            "pending": self.pending.to_json() if self.pending else None,
            "updated": layout.iso_now(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PartitionState:
        if d.get("version") != _STATE_VERSION:
            raise LandingCorrupt(f"unknown state version {d.get('version')!r}")
        pending = d.get("pending")
        return cls(
            last_offset=None if d.get("last_offset") is None else int(d["last_offset"]),
            watermark_ms=None if d.get("watermark_ms") is None else int(d["watermark_ms"]),
            files=int(d.get("files", 0)),
            pending=FileRange.from_json(pending) if pending else None,
        )


def _landing_error(exc: OSError, what: str) -> LandingError:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return LandingError(f"{what}: {name}: {exc.strerror or exc}", errno=exc.errno)


class LocalStore:
    """The landing in one local (or shared POSIX) directory. Thread-compatible per partition: the
    flock serialises committers of one partition across threads and processes."""

    def __init__(self, root: Path, *, max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS) -> None:
        self.root = Path(root)
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

    def _locked(self, topic: str, partition: int) -> contextlib.AbstractContextManager[None]:
        return fsutil.locked(self._lock_path(topic, partition))

    # -- state ----------------------------------------------------------------------------------

    def _read_state(self, topic: str, partition: int) -> PartitionState:
        path = self._state_path(topic, partition)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            st = self._rebuild_state(topic, partition)
            if st.last_offset is not None:
                self._write_state(topic, partition, st)
            return st
        try:
            return PartitionState.from_json(json.loads(data))
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
        mark: int | None = None
        for r in ranges:
            mark = watermark.watermark_after(mark, r, self.max_event_ahead_ms)
        return PartitionState(
            last_offset=max(r.last_offset for r in ranges), watermark_ms=mark, files=len(ranges)
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
        return sorted(out, key=lambda r: r.first_offset)

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
            )
        else:
            st = replace(st, pending=None)
        self._write_state(topic, partition, st)
        return st

    def state(self, topic: str, partition: int) -> PartitionState:
        """The partition's state record, with any half-done publication completed."""
        try:
            with self._locked(topic, partition):
                return self._recover(topic, partition, self._read_state(topic, partition))
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: reading landing state") from None

    def head(self, topic: str, partition: int) -> PartitionHead:
        st = self.state(topic, partition)
        return PartitionHead(st.last_offset, st.watermark_ms, st.files)

    def advance_watermark(self, topic: str, partition: int, watermark_ms: int) -> None:
        try:
            with self._locked(topic, partition):
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
        try:
            layout.makedirs_durable(final_dir, self.root)
            size = layout.write_parquet(tmp, records, rng, compression)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise _landing_error(exc, f"{rng.topic}/{rng.partition}: publishing {rng.path}") from None
        return StagedFile(replace(rng, bytes=size, created=layout.iso_now()), str(tmp))

    def discard(self, staged: StagedFile) -> None:
        with contextlib.suppress(OSError):
            Path(staged.location).unlink(missing_ok=True)

    def commit(self, staged: StagedFile, expected_last: int | None) -> FileRange:
        rng = staged.range
        topic, partition = rng.topic, rng.partition
        tmp = Path(staged.location)
        final = self.root / rng.path
        try:
            with self._locked(topic, partition):
                st = self._recover(topic, partition, self._read_state(topic, partition))
                # None in the state: nothing was ever published, so nothing can be duplicated
                ok = st.last_offset is None or (
                    st.last_offset == expected_last and rng.first_offset > st.last_offset
                )
                if not ok:
                    raise PublishConflict(topic, partition, expected_last, st.last_offset)
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
                    st.last_offset = max([st.last_offset or -1, *(r.last_offset for r in existing)])
                    self._write_state(topic, partition, st)
                    raise PublishConflict(topic, partition, expected_last, st.last_offset) from None
                os.unlink(tmp)
                layout.fsync_dir(final.parent)
                self._append_manifest(self._manifest_path(topic, partition, rng.created), rng)
                st = PartitionState(
                    last_offset=rng.last_offset,
                    watermark_ms=watermark.watermark_after(st.watermark_ms, rng, self.max_event_ahead_ms),
                    files=st.files + 1,
                )
                self._write_state(topic, partition, st)
            return rng
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: publishing {rng.path}") from None


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
