"""Conditional, atomic publication of Parquet files, and the per-partition state behind it.

Blocking code: it runs in the sink's worker thread (or in tools), never on the event loop.

Publishing one file of (topic, partition):

1. encode the records into a hidden temp file in the target folder and fsync it (no lock held);
2. take ``fcntl.flock`` on ``_state/<t>/<p>.lock`` (cross-process), read the state and finish any
   publication a crashed process left half done (see ``pending`` below);
3. check the condition: the state's last published offset is the one the publisher expects (the
   offset it resumed after, or its own last publication) and the new range starts after it.
   Otherwise another owner published in between: ``PublishConflict`` (the caller drops its batch
   and re-seeks after ``PublishConflict.last_offset``);
4. record the intent (``pending``) in the state file, ``os.link`` the temp file to its final name
   (exclusive: EEXIST is a conflict too), unlink the temp name, fsync the folder;
5. append the manifest line, write the state with the new last offset, release the lock.

The link is the commit point. A crash after it and before the state update leaves ``pending`` in
the state; whoever takes the lock next sees that the final file exists and completes steps 5.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mqd import fsutil
from mqd.errors import MqdError
from mqd.landing import layout
from mqd.landing.layout import FileRange, LandingCorrupt, LandingError

_STATE_VERSION = 1


class PublishConflict(MqdError):
    """Another owner published offsets of this partition first. Not retriable as is: drop the
    batch and resume after ``last_offset``."""

    retriable = False

    def __init__(self, topic: str, partition: int, expected: int | None, last_offset: int | None) -> None:
        super().__init__(
            f"{topic}/{partition}: publication conflict: expected last published offset {expected}, "
            f"landing directory has {last_offset}"
        )
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.last_offset = last_offset


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


@dataclass(slots=True)
class PublishOutcome:
    """What ``publish_records`` did with one partition's records."""

    published: list[FileRange] = field(default_factory=list)
    remaining: list[pa.RecordBatch] = field(default_factory=list)  # not published (error)
    conflict: PublishConflict | None = None
    error: LandingError | None = None

    @property
    def last_offset(self) -> int | None:
        return self.published[-1].last_offset if self.published else None


def _landing_error(exc: OSError, what: str) -> LandingError:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return LandingError(f"{what}: {name}: {exc.strerror or exc}", errno=exc.errno)


class Publisher:
    """Publishes into one landing directory. Thread-compatible per partition: the flock serialises
    publishers of one partition across threads and processes."""

    def __init__(self, root: Path, *, compression: str = "snappy") -> None:
        self.root = Path(root)
        self.compression = compression

    # -- paths ----------------------------------------------------------------------------------

    def _state_path(self, topic: str, partition: int) -> Path:
        return self.root / layout.STATE_DIR / topic / f"{partition:05d}.json"

    def _lock_path(self, topic: str, partition: int) -> Path:
        return self.root / layout.STATE_DIR / topic / f"{partition:05d}.lock"

    def _manifest_dir(self, topic: str, partition: int) -> Path:
        return self.root / layout.MANIFEST_DIR / topic / f"{partition:05d}"

    def _manifest_path(self, topic: str, partition: int, created: str) -> Path:
        """One manifest file per partition and UTC day of publication, so recovery reads a day."""
        day = created[:10] if len(created) >= 10 else layout.iso_now()[:10]
        return self._manifest_dir(topic, partition) / f"{day}.jsonl"

    def ensure_root(self) -> None:
        """Create the landing root and prove it is writable; LandingError when it is not."""
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

    def remove_stale_temp_files(self, older_than_s: float = 3600.0) -> int:
        """Delete temp files that crashed publishers left in hour folders. A publication takes
        seconds, so a temp file older than ``older_than_s`` belongs to no live publisher (also
        when several hosts share the directory, where pids say nothing)."""
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
                layout.write_atomic(mpath, b"".join(self._manifest_line(r) for r in ranges))
        if not ranges:
            return PartitionState()
        return PartitionState(
            last_offset=max(r.last_offset for r in ranges),
            watermark_ms=max(r.ts_max for r in ranges),
            files=len(ranges),
        )

    def _scan_files(self, topic: str, partition: int) -> list[FileRange]:
        out: list[FileRange] = []
        pattern = f"dt=*/hour=*/part-{partition:05d}-*.parquet"
        for path in sorted((self.root / f"topic={topic}").glob(pattern)):
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
                watermark_ms=max(st.watermark_ms or rng.ts_max, rng.ts_max),
                files=st.files + 1,
            )
        else:
            st = replace(st, pending=None)
        self._write_state(topic, partition, st)
        return st

    def state(self, topic: str, partition: int) -> PartitionState:
        """The partition's state, with any half-done publication completed."""
        try:
            with self._locked(topic, partition):
                return self._recover(topic, partition, self._read_state(topic, partition))
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: reading landing state") from None

    def last_published(self, topic: str, partition: int) -> int | None:
        """The last offset published for the partition: resume after it (None: nothing yet)."""
        return self.state(topic, partition).last_offset

    def advance_watermark(self, topic: str, partition: int, watermark_ms: int) -> None:
        """Record that the partition has nothing unpublished below ``watermark_ms`` (it is idle)."""
        try:
            with self._locked(topic, partition):
                st = self._recover(topic, partition, self._read_state(topic, partition))
                if st.watermark_ms is None or watermark_ms > st.watermark_ms:
                    st.watermark_ms = watermark_ms
                    self._write_state(topic, partition, st)
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: writing landing state") from None

    # -- manifest -------------------------------------------------------------------------------

    @staticmethod
    def _manifest_line(rng: FileRange) -> bytes:
        return json.dumps(rng.to_json(), separators=(",", ":")).encode() + b"\n"

    def _append_manifest(self, path: Path, rng: FileRange) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        line = self._manifest_line(rng)
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

    # -- publication ----------------------------------------------------------------------------

    def publish(self, topic: str, partition: int, records: pa.Table, expected_last: int | None) -> FileRange:
        """Publish ``records`` (RECORD_SCHEMA, one hour, ascending offsets) as one file.

        Raises PublishConflict when the partition's last published offset is not
        ``expected_last`` (None: the publisher expects nothing published yet), LandingError when
        the directory cannot be written.
        """
        first, last, count, ts_min, ts_max = layout.describe(topic, partition, records)
        hour = int(layout.folder_hours(np.array([ts_min], dtype=np.int64))[0])
        rel_dir = layout.hour_dir(topic, hour)
        name = layout.file_name(partition, first)
        final_dir = self.root / rel_dir
        final = final_dir / name
        tmp = final_dir / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        rng = FileRange(f"{rel_dir}/{name}", topic, partition, first, last, count, ts_min, ts_max)
        try:
            layout.makedirs_durable(final_dir, self.root)
            size = layout.write_parquet(
                tmp, layout.landing_table(topic, partition, records), rng, self.compression
            )
            rng = replace(rng, bytes=size, created=layout.iso_now())
            with self._locked(topic, partition):
                st = self._recover(topic, partition, self._read_state(topic, partition))
                # None in the state: nothing was ever published, so nothing can be duplicated
                ok = st.last_offset is None or (st.last_offset == expected_last and first > st.last_offset)
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
                layout.fsync_dir(final_dir)
                self._append_manifest(self._manifest_path(topic, partition, rng.created), rng)
                st = PartitionState(
                    last_offset=last,
                    watermark_ms=max(st.watermark_ms or ts_max, ts_max),
                    files=st.files + 1,
                )
                self._write_state(topic, partition, st)
            return rng
        except OSError as exc:
            raise _landing_error(exc, f"{topic}/{partition}: publishing {rel_dir}/{name}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def publish_records(
        self,
        topic: str,
        partition: int,
        batches: list[pa.RecordBatch],
        expected_last: int | None,
        max_records: int | None = None,
    ) -> PublishOutcome:
        """Publish drained batches of one partition: one file per run of records in one hour, cut
        into files of at most ``max_records`` records.

        Never raises for conflicts or disk errors: the outcome says what was published and what
        is left, so the caller keeps the rest buffered (disk) or drops it (conflict).
        """
        out = PublishOutcome()
        table = layout.concat(batches)
        step = max_records or table.num_rows or 1
        pieces = [
            (start + i, min(step, length - i))
            for _hour, start, length in layout.hour_runs(table)
            for i in range(0, length, step)
        ]
        for start, length in pieces:
            try:
                rng = self.publish(topic, partition, table.slice(start, length), expected_last)
            except PublishConflict as exc:
                out.conflict = exc
                return out
            except LandingError as exc:
                out.error = exc
                out.remaining = table.slice(start).to_batches()
                return out
            out.published.append(rng)
            expected_last = rng.last_offset
        return out


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
    pattern = f"{topic}/*/*.jsonl" if topic else "*/*/*.jsonl"
    out: list[FileRange] = []
    for path in sorted(base.glob(pattern)):
        out.extend(read_manifest_file(path))
    return out
