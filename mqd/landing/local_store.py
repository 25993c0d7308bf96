"""The local store: the landing on a POSIX directory, with the same claim-chain protocol as object
storage (landing format 3). Blocking code: it runs on the sink's worker threads, or in tools.

``LocalStore`` is the landing store (store.py, claim_chain.py) over ``LocalObjects``
(local_objects.py): a create-only put is an exclusive ``os.link``, a server-side copy a link, so
the argument that the chain lands exactly once is one argument for both stores, and no lock is held
across a publication: a frozen publisher cannot stall another owner. What Spark reads does not
change: ``topic=<t>/dt=.../hour=.../part-*.parquet`` files and ``_COMPLETE`` markers; the manifest
is read through the store (``manifest``; the Spark job does).

A landing of format 2 (flock + link, local_format2.py) or 1 is refused with the migration command
(local_migration.py).
"""

from __future__ import annotations

from pathlib import Path

from mqd.landing import watermark
from mqd.landing.errors import LandingError, ObjectStoreError
from mqd.landing.local_objects import LocalObjects
from mqd.landing.store import LandingStore

# a swap of a small bookkeeping record holds its key's lock for one read and a rename; waiting
# longer means the holder is frozen (a stopped VM, SIGSTOP): give up and retry later
COMMIT_LOCK_TIMEOUT_S = 5.0


class LocalStore(LandingStore):
    """The landing in one local (or shared POSIX) directory."""

    def __init__(
        self,
        root: Path,
        *,
        commit_lock_timeout: float = COMMIT_LOCK_TIMEOUT_S,
        max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS,
    ) -> None:
        self.root = Path(root)
        # commit_lock_timeout bounds every wait for a swap lock (local_objects.py): a frozen holder
        # makes the write fail with a retriable error after it, never wait as long as the freeze
        super().__init__(
            LocalObjects(self.root, cas_lock_timeout=commit_lock_timeout),
            max_event_ahead_ms=max_event_ahead_ms,
        )

    def open(self) -> None:
        """Create the landing if needed, prove it writable and honouring the conditions the chain
        relies on, check its format (LandingStore.open)."""
        try:
            super().open()
        except ObjectStoreError as exc:
            msg = f"landing directory {self.root} is not writable: {exc}"
            raise LandingError(msg, errno=exc.errno) from None
