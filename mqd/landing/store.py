"""The storage seam: what the landing needs of the place files land in, behind one interface.

The contract (DESIGN.md §3): a range of a partition lands as ONE visible file, or the publisher
learns that another owner got there first and where that owner's landed range ends; offsets are
committed only after the file is visible; a restart resumes from the store's published head.

Publication is split in two steps so that a store without locks, rename or append (object storage,
whose primitive is the single-part conditional PUT) fits as well as the local directory:

``stage``   encode the file and write it durably where no reader looks. No lock, no condition:
            any number of owners may stage the same range at once. Guarantees: when it returns,
            the bytes survive a crash; nothing is visible; the staged file belongs to this caller.
            Both stores: the file under ``_staging/`` (object storage: a PUT, multipart is
            fine; a local directory: encoded in a scratch folder, linked into place, fsynced).
``open_stage`` the same as ``stage``, a row group at a time: ``StageWriter.write(table)`` appends
            one row group to the staged file as the records arrive, ``finish(rng)`` closes it
            with its final range and returns the ``StagedFile`` (``abort()`` forgets it), so a
            large file is never held in memory whole (local: a scratch file; object storage: a
            multipart upload of parts of at least 5 MiB, or one PUT when it stays small).
``commit``  the conditional step, given the previous end the caller believes in
            (``expected_last``). Guarantees: either the staged file is visible under its final
            name, recorded in the manifest and the head, exactly once across every owner and
            process, and ``commit`` returns its range; or nothing of it becomes visible and
            ``PublishConflict`` says the landed end the caller must resume after. A crash at any
            point leaves one of the two outcomes, completed by whoever reads the head next.
            Both stores (landing format 3, claim_chain.py): a head check, then a single-part
            create-only claim object per partition chain (``If-None-Match: *``; on a local
            directory an exclusive ``os.link``), keyed by the next sequence number, carrying a
            nonce to resolve lost responses, as the commit point and manifest line, then
            promotion of the staged object to its visible name by server-side copy (a local
            directory: a link). No lock is held across a publication on either store.
``discard`` forget a staged file that was not committed (conflict, error); idempotent.

Everything else is read-side: the published head (resume position), the manifest, the visible
data files (what the Spark job may read), per-partition watermarks and completeness markers, and
two chores (``open`` checks the store's format and that it is writable, ``remove_stale`` deletes
what crashed stagers left behind; the age threshold there decides cost, never correctness).

All methods block (file or network I/O): the sink calls them on its worker threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mqd.landing.layout import FileRange
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_import("pyarrow")

STALE_AFTER_S = 3600.0  # a staged file this old belongs to no live publisher (a publication takes seconds)


@dataclass(frozen=True, slots=True)
class StagedFile:
    """A file written durably but not visible: the output of ``stage``, the input of ``commit``."""

    range: FileRange  # with its size and creation time
    location: str  # where the store keeps the staged bytes (local: the temp file's path)


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


class StageWriter(Protocol):
    """One staged file being written a row group at a time (``LandingStore.open_stage``). Used by
    one thread at a time; nothing of it is visible or durable before ``finish`` returns."""

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (the landing schema) as row groups."""
        ...

    def finish(self, rng: FileRange) -> StagedFile:
        """Close the file with ``rng`` (its final range: last offset, count, event times) in its
        metadata and make it durable, still invisible: the input of ``commit``."""
        ...

    def abort(self) -> None:
        """Forget the file (nothing was committed); idempotent, never raises."""
        ...


class LandingStore(Protocol):
    """The landing's publication contract (see the module docstring). LandingError: the store
    cannot be written now (retriable); LandingCorrupt: it holds something mqd did not write."""

    @property
    def location(self) -> str:
        """Where the landing is, for logs and status (local: the directory)."""
        ...

    def open(self) -> None:
        """Create the landing if needed and prove it is writable."""
        ...

    def remove_stale(self, older_than_s: float = STALE_AFTER_S) -> int:
        """Delete staged files older than ``older_than_s``; returns how many."""
        ...

    def stage(self, records: pa.Table, rng: FileRange, compression: str) -> StagedFile:
        """Encode ``records`` (the landing schema, one hour, one partition) as the file ``rng``
        describes and write it durably, invisible, without a lock."""
        ...

    def open_stage(self, rng: FileRange, compression: str) -> StageWriter:
        """Start staging the file ``rng`` names (its path: topic, partition, hour, first offset,
        incarnation; the rest of ``rng`` is given to ``finish``), written a row group at a time."""
        ...

    def commit(
        self, staged: StagedFile, expected_last: int | None, expected_incarnation: str | None = None
    ) -> FileRange:
        """Make ``staged`` visible if the partition's last published (incarnation, offset) is
        (``expected_incarnation``, ``expected_last``) (None: nothing published yet / unknown) and
        the range starts after it or belongs to another incarnation; PublishConflict otherwise."""
        ...

    def discard(self, staged: StagedFile) -> None:
        """Remove a staged file that was not (or could not be) committed."""
        ...

    def head(self, topic: str, partition: int) -> PartitionHead:
        """The partition's published head, with any half-done commit completed."""
        ...

    def advance_watermark(self, topic: str, partition: int, watermark_ms: int) -> None:
        """Record that the partition has nothing unpublished below ``watermark_ms``."""
        ...

    def watermarks(self, topic: str, partitions: int) -> list[int | None]:
        """Watermark of partitions 0..partitions-1 (None: unknown)."""
        ...

    def update_markers(self, topic: str, partitions: int) -> list[str]:
        """Write the completeness marker of every hour that became whole; returns them."""
        ...

    def manifest(self, topic: str | None = None) -> list[FileRange]:
        """Every published file (of ``topic``), in manifest order per partition."""
        ...

    def visible_files(self) -> list[str]:
        """Every data file a reader of the landing can see, '/'-separated paths relative to the
        landing root (the Spark job compares it with the manifest)."""
        ...


def open_store(
    location: Path | str,
    *,
    head_lock_timeout: float | None = None,
    max_event_ahead_ms: int | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
) -> LandingStore:
    """The store for ``landing.dir``: the local directory (local_store.py: the object store over
    local_objects.py), or for an ``s3://bucket/prefix`` URI the object store over S3
    (``endpoint_url``/``region`` select an S3-compatible store). ``head_lock_timeout``: kept for
    callers; the claim chain reads a head without a lock; ``max_event_ahead_ms``: the watermark's bound
    (landing.max_event_ahead, watermark.py; None: its default)."""
    from mqd.landing.watermark import DEFAULT_MAX_EVENT_AHEAD_MS

    ahead_ms = DEFAULT_MAX_EVENT_AHEAD_MS if max_event_ahead_ms is None else max_event_ahead_ms
    if isinstance(location, str) and location.startswith("s3://"):
        from mqd.landing.object_store import ObjectStore
        from mqd.landing.s3_objects import S3Objects

        objects = S3Objects(location, endpoint_url=endpoint_url, region=region)
        return ObjectStore(objects, max_event_ahead_ms=ahead_ms)
    from mqd.landing.local_store import LocalStore

    return LocalStore(Path(location), head_lock_timeout=head_lock_timeout, max_event_ahead_ms=ahead_ms)
