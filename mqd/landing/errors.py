"""The landing's errors, in one place: what the store, the claim chain and the object primitives
raise, and what their callers (the sink, the daemon, the tools) decide on.

Two families, by the flag the daemon acts on (mqd/errors.py):

- ``LandingError`` (retriable): the landing cannot be written now (a full or read-only disk, a
  store that does not answer, a swap lock held past its bound); the daemon pauses and retries.
- ``LandingCorrupt`` (not retriable): the landing holds something mqd did not write, or of another
  format, or a claim chain whose links do not hold; a human repairs, migrates or upgrades.

``PublishConflict`` is an answer, not a failure: another owner landed the range first.
``PreconditionFailed`` is the object primitives' definite "the condition did not hold".
Then the errors of the landing's other mechanisms: the first encode (``PreflightError``), the
lifecycle's query records (``LifecycleConflict``), the landing table (``TableUnavailable``,
``TableError``, ``StaleCommit``) and its queries (``QueryError``).
"""

from __future__ import annotations

import errno as _errno

from mqd.errors import MqdError


class LandingError(MqdError):
    """The landing directory cannot be written (disk full, read-only, permissions). Retriable:
    the daemon pauses fetching and retries until the disk accepts writes again."""

    retriable = True

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class LandingCorrupt(MqdError):
    """A file or state record in the landing directory is not what mqd wrote. Not retriable."""

    retriable = False


class LandingFormatError(LandingCorrupt):
    """The landing directory has another format than this mqd writes (an old landing to migrate,
    or a newer mqd's). Not retriable: an operator migrates or upgrades."""


class ChainBroken(LandingCorrupt):
    """A claim chain whose links do not hold (a claim deleted, overwritten, unreadable, or one
    that does not start where the one before it ended). Not retriable: nothing of the partition is
    read or published past it until a human repairs the landing (``mqd landing check`` lists
    every broken link). ``key``: the object, relative to the landing root."""

    def __init__(self, location: str, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(
            f"claim chain broken at {location}/{key}: {problem}; nothing of the partition is read or "
            "published past it (mqd landing check lists every broken link)"
        )


class PublishConflict(MqdError):
    """Another owner published offsets of this partition first. Not retriable as is: drop the
    batch and resume after ``last_offset``."""

    retriable = False

    def __init__(
        self,
        topic: str,
        partition: int,
        expected: int | None,
        last_offset: int | None,
        *,
        incarnation: str | None = None,
    ) -> None:
        super().__init__(
            f"{topic}/{partition}: publication conflict: expected last published offset {expected}, "
            f"landing directory has {last_offset} (incarnation {incarnation})"
        )
        self.topic = topic
        self.partition = partition
        self.expected = expected
        self.last_offset = last_offset
        self.incarnation = incarnation  # of the landed last_offset: resume there under it


class CommitLockTimeout(LandingError):
    """A store with locks found the partition's publication lock held past its bound (a frozen
    holder?): nothing was published; the publisher keeps its batch and tries again later, and
    the daemon does not treat it as an unwritable landing. Retriable."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=_errno.ETIMEDOUT)


class PreconditionFailed(MqdError):
    """The condition of a put did not hold (the key exists, or its etag differs); nothing written."""

    retriable = False


class ObjectStoreError(LandingError):
    """The store did not answer (network, timeout, 5xx): the request's effect is unknown.
    Retriable, like a full disk for the local store."""


class UnsafeObjectStore(MqdError):
    """The store accepted a write its condition forbids: exactly-once cannot hold on it."""

    retriable = False


class PreflightError(MqdError):
    """The landing cannot encode a file with its settings: nothing would ever be published."""

    retriable = False


class LifecycleConflict(MqdError):
    """Another query (another checkpoint) is registered under this name: recording under it would
    let one query's progress release the other's files. Not retriable: rename a table or
    deregister the old query."""

    retriable = False


class TableUnavailable(MqdError):
    """landing.table = "delta" without the deltalake package installed: the daemon refuses to
    start (a table that silently stays empty would be worse)."""

    retriable = False


class TableError(LandingError):
    """The Delta log could not be read or written (the store did not answer, a commit failed for
    another reason). Retriable: the next round tries again; the landing goes on meanwhile."""


class StaleCommit(MqdError):
    """A commit lost to a commit of the same partitions (another committer got there first, a
    frozen owner's committer after its session expired): nothing of it is in the table. The
    committer drops it, counts it, and computes what is missing again."""

    retriable = True


class QueryError(MqdError):
    """The query could not run (no table there, a missing engine, bad SQL)."""

    retriable = False
