"""The storage seam: ``LandingStore``, the one store the landing publishes into and reads from.

The contract (DESIGN.md §3): a range of a partition lands as ONE visible file, or the publisher
learns that another owner got there first and where that owner's landed range ends; offsets are
committed only after the file is visible; a restart resumes from the store's published head.

One store, two backends: ``LandingStore`` runs the claim chain (claim_chain.py, landing format 3)
on object primitives (objects.py): S3-compatible storage (s3_objects.py) or a POSIX directory
(local_objects.py; ``LocalStore``, local_store.py, is this store on a directory). ``open_store``
(backends.py) picks the backend ``landing.dir`` names. The callers use this class as it is: the
sink and the publisher its publication steps and heads; the daemon, the Spark job, the lifecycle
and ``mqd offsets reset`` also its ``objects``, to read the chains (chain_reader.py) and keep their
own records beside them.

Publication is split in two steps so that a store without locks, rename or append (object storage,
whose primitive is the single-part conditional PUT) fits as well as the local directory:

``open_stage`` encode the file and write it durably where no reader looks, a row group at a time
            (stage_writer.py: ``write(table)`` appends one row group as the records arrive,
            ``finish(rng)`` closes it with its final range and returns the ``StagedFile``,
            ``abort()`` forgets it), so a large file is never held in memory whole. No lock, no
            condition: any number of owners may stage the same range at once. Guarantees: when
            ``finish`` returns, the bytes survive a crash; nothing is visible; the staged file
            belongs to this caller. A local directory encodes it in its scratch folder, on the
            same filesystem, and links it under ``_staging/``; object storage streams it under
            ``_staging/`` as a multipart upload (one PUT when small; no condition needed: the
            key is fresh).
``commit``  the conditional step, given the previous end the caller believes in
            (``expected_last``). Guarantees: either the staged file is visible under its final
            name, recorded in the manifest and the head, exactly once across every owner and
            process, and ``commit`` returns its range; or nothing of it becomes visible and
            ``PublishConflict`` says the landed end the caller must resume after. A crash at any
            point leaves one of the two outcomes, completed by whoever reads the head next.
            The claim chain: a head check, then a single-part create-only claim object per
            partition chain (``If-None-Match: *``; on a local directory an exclusive
            ``os.link``), keyed by the next sequence number, carrying a nonce to resolve lost
            responses, as the commit point and manifest line, then promotion of the staged
            object to its visible name by server-side copy (a local directory: a link). No lock
            is held across a publication.
``discard`` forget a staged file that was not committed (conflict, error); idempotent.

Everything else is read-side: the published head (resume position), the manifest, the visible
data files (what the Spark job may read), per-partition watermarks and completeness markers, and
two chores (``open`` checks the store's format, that it is writable and that it honours the
conditional writes the chain's exactly-once rests on (some emulators and proxies overwrite
silently); ``remove_stale`` deletes what crashed stagers left behind; the age threshold there
decides cost, never correctness).

Layout under the landing root (``s3://bucket/prefix`` or a directory)::

    topic=<t>/dt=YYYY-MM-DD/hour=HH/part-....parquet      visible data files
    topic=<t>/dt=YYYY-MM-DD/hour=HH/_COMPLETE             completeness markers
    _staging/<t>/<partition:05d>/<uuid>.parquet[.reap]     staged files (+ the janitor's markers)
    _log/<t>/<partition:05d>/claims/<seq:020d>.json        the claim chain (claim_chain.py)
    _log/<t>/<partition:05d>/floor.json                    its retention floor
    _manifest/<t>/<partition:05d>/<seq>-<seq>.jsonl        claims archived below the floor
    _state/<t>/<partition:05d>.json                        idle watermark (If-Match updates)
    _state/<t>/_markers.json                               hours already marked complete

All methods block (file or network I/O): the sink calls them on its worker threads.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqd import fsutil
from mqd.landing import layout, markers, watermark
from mqd.landing.claim_chain import REAP_SUFFIX, Claim, PartitionChain, log_partitions, reap, staging_prefix
from mqd.landing.errors import (
    CommitLockTimeout,
    LandingCorrupt,
    LandingError,
    LandingFormatError,
    PreconditionFailed,
    UnsafeObjectStore,
)
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.landing.stage_writer import ParquetStage, StagedFile, Upload
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_import("pyarrow")

STALE_AFTER_S = 3600.0  # a staged file this old belongs to no live publisher (a publication takes seconds)
_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class PartitionHead:
    """The published head of a partition: what is landed, with any half-done commit completed."""

    last_offset: int | None  # resume after it; None: nothing published yet
    watermark_ms: int | None  # every record below this event time is published (or none exists)
    files: int
    incarnation: str | None = None  # the log incarnation last_offset belongs to (None: unknown)
    # the source's leader epoch of the record at last_offset (or a later one of the same log), for
    # a restart to validate the landed position against the source (KIP-320); None: unknown
    leader_epoch: int | None = None


class LandingStore:
    """The landing on object primitives (see the module docstring). Thread-safe: chains are per
    partition, and the sink runs at most one publication per partition at a time (readers may run
    beside it)."""

    def __init__(
        self,
        objects: Objects,
        *,
        unsafe_skip: frozenset[str] = frozenset(),
        max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS,
    ) -> None:
        self.objects = objects
        self.unsafe_skip = unsafe_skip
        self.max_event_ahead_ms = max_event_ahead_ms  # landing.max_event_ahead (watermark.py)
        self.voided = 0  # claims voided by this process (their ranges are fetched again)
        self._chains: dict[tuple[str, int], PartitionChain] = {}
        self._claimed: set[str] = set()  # staged keys a claim may name: only the janitor removes them
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return self.objects.location

    def chain(self, topic: str, partition: int) -> PartitionChain:
        with self._lock:
            ch = self._chains.get((topic, partition))
            if ch is None:
                ch = PartitionChain(
                    self.objects,
                    topic,
                    partition,
                    unsafe_skip=self.unsafe_skip,
                    on_void=self._count_void,
                    max_event_ahead_ms=self.max_event_ahead_ms,
                )
                self._chains[(topic, partition)] = ch
            return ch

    def _count_void(self, _claim: Claim) -> None:
        with self._lock:
            self.voided += 1

    # -- chores -----------------------------------------------------------------------------------

    def open(self) -> None:
        """Prove the store writable and that it honours both conditions the chain relies on;
        write the format marker of a new landing, refuse a landing of another format."""
        self._probe()
        self._check_format()

    def _check_format(self) -> None:
        """Create the format marker of a new landing; accept format 3 (and format 2 written by the
        claim chain on object storage: the same layout); refuse anything else, naming the
        migration command for the older local formats, so daemons of two formats never publish
        into one landing."""
        where = f"{self.location}/{layout.FORMAT_FILE}"
        got = self.objects.get(layout.FORMAT_FILE)
        if got is None:
            if self._has_landed():
                raise LandingFormatError(
                    f"{self.location}: landing format 1 (landed before log incarnations, no "
                    f"{layout.FORMAT_FILE}); this mqd writes format {layout.FORMAT_VERSION}. Stop every "
                    f"daemon of this landing, then migrate it: {layout.MIGRATE_COMMAND}"
                )
            body = json.dumps(
                {"format": layout.FORMAT_VERSION, "store": layout.FORMAT_STORE, "created": layout.iso_now()}
            ).encode()
            try:
                self.objects.put(layout.FORMAT_FILE, body, if_absent=True)
                return
            except PreconditionFailed:
                got = self.objects.get(layout.FORMAT_FILE)  # another daemon created it first
        try:
            d = json.loads(got[0]) if got else {}
            version, store = int(d["format"]), d.get("store")
        except (ValueError, KeyError, TypeError):
            raise LandingCorrupt(f"{where}: unreadable landing format marker") from None
        if store == layout.FORMAT_STORE and version in (2, layout.FORMAT_VERSION):
            return
        if version > layout.FORMAT_VERSION:
            raise LandingFormatError(
                f"{where}: landing format {version} was written by a newer mqd (this one writes "
                f"format {layout.FORMAT_VERSION}); upgrade this daemon"
            )
        raise LandingFormatError(
            f"{where}: landing format {version} ({store or 'local layout'}); this mqd lands format "
            f"{layout.FORMAT_VERSION} (the claim chain). Stop every daemon of this landing, then "
            f"migrate it: {layout.MIGRATE_COMMAND}"
        )

    def _has_landed(self) -> bool:
        """Something was landed here before any format marker existed (format 1)."""
        for prefix in (f"{layout.STATE_DIR}/", f"{layout.MANIFEST_DIR}/", "_log/"):
            # format 2's lock files alone are no landing (a daemon that never published)
            if any(not o.key.endswith(".lock") for o in self.objects.list_objects(prefix)):
                return True
        return any(d.startswith("topic=") for d in self.objects.list_dirs(""))

    def _probe(self) -> None:
        key = f"_staging/_probe-{secrets.token_hex(8)}"
        etag = self.objects.put(key, b"probe", if_absent=True)
        try:
            try:
                self.objects.put(key, b"overwrite", if_absent=True)
                raise UnsafeObjectStore(
                    f"{self.location}: the store overwrote an object despite If-None-Match: *; "
                    "it cannot land exactly once (use S3, or a store with conditional writes)"
                )
            except PreconditionFailed:
                pass
            try:
                self.objects.put(key, b"overwrite", if_match='"00000000000000000000000000000000"')
                raise UnsafeObjectStore(
                    f"{self.location}: the store overwrote an object despite a failing If-Match; "
                    "it cannot land exactly once"
                )
            except PreconditionFailed:
                pass
            self.objects.put(key, b"probe-2", if_match=etag)
        finally:
            self.objects.delete(key)

    def remove_stale(self, older_than_s: float = STALE_AFTER_S) -> int:
        """The janitor: delete staged objects older than ``older_than_s`` that no claim needs
        (claim_chain.reap), and markers whose object is gone."""
        cutoff = time.time() - older_than_s
        removed = 0
        markers: list[str] = []
        staged: set[str] = set()
        for info in self.objects.list_objects("_staging/"):
            if info.key.endswith(REAP_SUFFIX):
                markers.append(info.key)
                continue
            staged.add(info.key)
            if info.modified >= cutoff:
                continue
            parts = info.key.split("/")
            if len(parts) != 4:  # a probe left by a crash
                self.objects.delete(info.key)
                removed += 1
                continue
            if reap(self.objects, info.key, self.chain(parts[1], int(parts[2]))):
                removed += 1
                staged.discard(info.key)
        for m in markers:
            if m[: -len(REAP_SUFFIX)] not in staged and self.objects.head(m[: -len(REAP_SUFFIX)]) is None:
                self.objects.delete(m)
        stale_uploads = getattr(self.objects, "remove_stale_uploads", None)  # S3: open staged files
        if stale_uploads is not None:
            removed += int(stale_uploads("_staging/", older_than_s))
        remove_temp = getattr(self.objects, "remove_temp", None)  # a local directory's temp files
        if remove_temp is not None:
            removed += int(remove_temp(older_than_s))
        return removed

    def compact(self, topic: str, partition: int, keep: int) -> int:
        """Retention of the claim chain: keep the newest ``keep`` claims (claim_chain.compact)."""
        return self.chain(topic, partition).compact(keep)

    # -- publication ------------------------------------------------------------------------------

    def open_stage(self, rng: FileRange, compression: str) -> ParquetStage:
        """A staged file written a row group at a time (stage_writer.py): a local directory
        encodes into a scratch file, linked under ``_staging/`` by ``finish``; object storage
        streams parts of a multipart upload (``open_upload``). OSError (local disk full, a folder
        that is a file) becomes a retriable LandingError."""
        key = f"{staging_prefix(rng.topic, rng.partition)}{secrets.token_hex(16)}.parquet"
        prepare = getattr(self.objects, "prepare", None)  # local: the visible folder, before the claim
        if prepare is not None:
            prepare(rng.path)
        try:
            scratch: Path | None = getattr(self.objects, "scratch_dir", None)  # local: link, not copy
            open_upload = getattr(self.objects, "open_upload", None)  # S3: streamed parts
            if scratch is not None or open_upload is None:  # else: a temp file, uploaded whole
                return self._local_stage(scratch, key, rng, compression)
            upload: Upload = open_upload(key)
            try:
                return _Staging(
                    rng,
                    pa.PythonFile(upload, mode="w"),
                    key,
                    compression,
                    done=upload.complete,
                    drop=upload.abort,
                )
            except BaseException:
                upload.abort()
                raise
        except OSError as exc:
            raise _staging_error(rng, exc) from None

    def _local_stage(self, scratch: Path | None, key: str, rng: FileRange, compression: str) -> ParquetStage:
        """Encode into a local file (the scratch folder, or the system's temp folder for objects
        that can only upload a whole file), uploaded by ``finish``."""
        folder = scratch if scratch is not None else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"mqd-stage-{key.rsplit('/', 1)[1]}"

        def done() -> int:
            try:
                size = fsutil.fsync_written_once(path)
                self.objects.upload(key, path)
            finally:
                path.unlink(missing_ok=True)  # linked into place (or failed): the scratch name goes
            return size

        return _Staging(
            rng,
            str(path),
            key,
            compression,
            done=done,
            drop=lambda: path.unlink(missing_ok=True),
            # a scratch file is linked into place, never read back here: its bytes go to disk as
            # they are written (a temp file to upload is read whole by ``finish``: its pages stay)
            wrote=None if scratch is None else lambda: fsutil.start_writeback(path),
        )

    def commit(
        self, staged: StagedFile, expected_last: int | None, expected_incarnation: str | None = None
    ) -> FileRange:
        rng = staged.range
        with self._lock:
            self._claimed.add(staged.location)  # before the claim is sent: its outcome may be unknown
        return self.chain(rng.topic, rng.partition).commit(
            rng,
            staged.location,
            expected_last,
            incarnation=rng.incarnation,
            expected_incarnation=expected_incarnation,
        )

    def discard(self, staged: StagedFile) -> None:
        """Delete a staged object no claim can name. One that a claim may name is left to the
        janitor: deleting it here could race a copy by whoever resolves that claim."""
        with self._lock:
            if staged.location in self._claimed:
                self._claimed.discard(staged.location)
                return
        self.objects.delete(staged.location)

    # -- read side --------------------------------------------------------------------------------

    def _state_key(self, topic: str, partition: int) -> str:
        return f"{layout.topic_state_dir(topic)}/{partition:05d}.json"

    def _idle_watermark(self, topic: str, partition: int) -> tuple[int | None, str | None]:
        got = self.objects.get(self._state_key(topic, partition))
        if got is None:
            return None, None
        try:
            wm = json.loads(got[0]).get("watermark_ms")
        except ValueError as exc:
            raise LandingCorrupt(f"{self._state_key(topic, partition)}: unreadable ({exc})") from None
        return (None if wm is None else int(wm)), got[1]

    def head(self, topic: str, partition: int) -> PartitionHead:
        _seq, st = self.chain(topic, partition).head()
        idle, _etag = self._idle_watermark(topic, partition)
        wm = st.watermark_ms if idle is None else max(idle, st.watermark_ms or idle)
        return PartitionHead(st.last_offset, wm, st.files, st.incarnation, st.leader_epoch)

    def advance_watermark(self, topic: str, partition: int, watermark_ms: int) -> None:
        """fsutil.LockTimeout (retriable) when a local directory's swap lock stays held (a frozen
        writer of this partition's record): the next idle round tries again."""
        key = self._state_key(topic, partition)
        body = json.dumps({"watermark_ms": watermark_ms, "updated": layout.iso_now()}).encode()
        with _lock_timeout_as_retry():
            for _ in range(_ATTEMPTS):
                cur, etag = self._idle_watermark(topic, partition)
                if cur is not None and cur >= watermark_ms:
                    return
                try:
                    if etag is None:
                        self.objects.put(key, body, if_absent=True)
                    else:
                        self.objects.put(key, body, if_match=etag)
                    return
                except PreconditionFailed:
                    continue  # another daemon moved it: read again

    def watermarks(self, topic: str, partitions: int) -> list[int | None]:
        return [self.head(topic, p).watermark_ms for p in range(partitions)]

    def update_markers(self, topic: str, partitions: int, now_ms: int | None = None) -> list[str]:
        """``_COMPLETE`` (create-only) in every existing hour folder that became whole
        (markers.py); ``now_ms``: the wall clock. fsutil.LockTimeout as ``advance_watermark``."""
        with _lock_timeout_as_retry():
            return markers.mark_complete_hours(
                self.objects, topic, partitions, self.watermarks(topic, partitions), now_ms
            )

    def _partitions(self, topic: str) -> list[int]:
        return log_partitions(self.objects, topic)

    def manifest(self, topic: str | None = None) -> list[FileRange]:
        topics = (
            [topic]
            if topic is not None
            else [d.rstrip("/").split("/")[1] for d in self.objects.list_dirs("_log/")]
        )
        out: list[FileRange] = []
        for t in sorted(topics):
            for p in self._partitions(t):
                out.extend(self.chain(t, p).manifest())
        return out

    def visible_files(self) -> list[str]:
        """Objects outside ``_``/``.`` paths (what a reader of the landing lists), data or not."""
        out: list[str] = []
        for top in self.objects.list_dirs(""):
            if top.startswith(("_", ".")):
                continue
            for info in self.objects.list_objects(top):
                if any(part.startswith(("_", ".")) for part in info.key.split("/")):
                    continue
                out.append(info.key)
        return sorted(out)


class _Staging(ParquetStage):
    """A ParquetStage whose I/O errors (a full local disk while encoding) are retriable
    LandingErrors naming the file, like every other landing write."""

    def __init__(
        self, rng: FileRange, where: str | pa.NativeFile, key: str, compression: str, **kw: Any
    ) -> None:
        self._rng = rng
        try:
            super().__init__(where, key, compression, **kw)
        except OSError as exc:
            raise _staging_error(rng, exc) from None

    def write(self, table: pa.Table) -> None:
        try:
            super().write(table)
        except OSError as exc:
            self.abort()
            raise _staging_error(self._rng, exc) from None

    def finish(self, rng: FileRange) -> StagedFile:
        try:
            return super().finish(rng)
        except OSError as exc:
            raise _staging_error(rng, exc) from None


def _staging_error(rng: FileRange, exc: OSError) -> LandingError:
    return LandingError(f"{rng.topic}/{rng.partition}: staging {rng.path}: {exc}", errno=exc.errno)


@contextlib.contextmanager
def _lock_timeout_as_retry() -> Iterator[None]:
    """A swap lock held past its bound (local directory) in a housekeeping write: the daemon
    skips the round (fsutil.LockTimeout) instead of pausing the landing (a LandingError)."""
    try:
        yield
    except CommitLockTimeout as exc:
        raise fsutil.LockTimeout(str(exc)) from None


def _value(prefix: str) -> str:
    """``2026-01-01`` of ``topic=t/dt=2026-01-01/`` (the value of the last ``k=v`` folder)."""
    return prefix.rstrip("/").rsplit("/", 1)[-1].split("=", 1)[1]
