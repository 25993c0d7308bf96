"""The landing table's Delta log as the committer needs it: the newest version and each appId's
``txn`` version, read one new commit at a time, and commits appended as the next version.

Why not delta-rs for this: delta-rs 1.6 rebuilds its whole snapshot (every file the table lists)
on every read of the log and every commit, ~5.7 us per listed file per round (decision 059), so a
round's cost grew with the landing, not with what it adds. A committer needs none of the file list:
only which offsets each (topic, partition, incarnation) holds, which the ``txn`` actions say.

- **Reading.** Once, from the log's listing: the newest checkpoint's ``txn`` (and ``protocol``,
  ``metaData``) columns, then every commit after it. Then, each round, the next version's JSON
  until there is none: one GET when nothing was committed. A checkpoint newer than the version
  read (``_last_checkpoint``; the commits after what was read may have expired meanwhile: a
  committer frozen for longer than the log retention) reads the log again from its listing.
- **Writing.** A commit is the next version's JSON, put create-only: a local link, S3's
  ``If-None-Match`` (the put every Delta writer relies on; delta-rs and Spark use the same one, so
  they can share the log). When the version is taken, the commit found there is read: it is ours
  (its ``mqd.commit`` nonce: a put whose answer was lost) → done; it holds a ``txn`` of an appId
  this commit writes → ``StaleCommit`` (another committer added these files first, the case
  delta-rs calls ``ConcurrentTransaction``); otherwise (other partitions, the cleaner's remove) the
  commit is tried one version up. Only blind appends are written here, so nothing else conflicts.
- **Protocol.** The table is created at reader 1 / writer 2 (delta_log.py); a log that asks for
  more (a writer that upgraded it) is read, but not written: TableError, said once per round.

Checkpoints and the expiry of old log entries stay delta-rs's (delta_log.py calls them after the
commit that completes a checkpoint interval): they need the whole table, once an interval.
"""

from __future__ import annotations

import io
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mqd.landing.errors import LandingError, PreconditionFailed, StaleCommit, TableError
from mqd.landing.objects import Objects
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow.parquet as pq
else:
    pq = lazy_import("pyarrow.parquet")

LOG = "_delta_log"
LAST_CHECKPOINT = f"{LOG}/_last_checkpoint"
READER_VERSION = 1  # what this module reads and writes
WRITER_VERSION = 2
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


def commit_key(version: int) -> str:
    return f"{LOG}/{version:020d}.json"


@dataclass(slots=True)
class Commit:
    """What this module reads of one commit."""

    version: int
    apps: dict[str, int] = field(default_factory=dict)  # txn appId -> version
    nonce: str | None = None  # commitInfo's mqd.commit: which mqd commit this is
    protocol: tuple[int, int] | None = None
    configuration: dict[str, str] | None = None  # metaData's, when the commit changes it


def parse_commit(version: int, body: bytes) -> Commit:
    """The txn, protocol, metaData and commitInfo actions of one commit's JSON lines."""
    out = Commit(version)
    for line in body.splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            raise TableError(f"{commit_key(version)}: not a Delta commit (a line is not JSON)") from None
        if "txn" in action:
            txn = action["txn"]
            out.apps[str(txn["appId"])] = int(txn["version"])
        elif "commitInfo" in action:
            nonce = action["commitInfo"].get("mqd.commit")
            out.nonce = None if nonce is None else str(nonce)
        elif "protocol" in action:
            p = action["protocol"]
            out.protocol = (int(p["minReaderVersion"]), int(p["minWriterVersion"]))
        elif "metaData" in action:
            out.configuration = {
                str(k): str(v) for k, v in (action["metaData"].get("configuration") or {}).items()
            }
    return out


class DeltaCommits:
    """One committer's view of a Delta log under ``objects``' root (module docstring). Blocking;
    one thread at a time."""

    def __init__(self, objects: Objects, *, max_retries: int = 200) -> None:
        self.objects = objects
        self.max_retries = max_retries  # versions tried up past commits of other partitions
        self.version = -1  # the newest version read; -1: no log read (or none exists)
        self.txns: dict[str, int] = {}
        self.protocol: tuple[int, int] = (READER_VERSION, WRITER_VERSION)
        self.configuration: dict[str, str] = {}

    # -- reading -----------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Read the log up to its newest version; False when there is no log."""
        if self.version < 0 or self._checkpoint_past_us():
            return self._read_from_listing()
        self._read_forward()
        return True

    def _checkpoint_past_us(self) -> bool:
        got = self._get(LAST_CHECKPOINT)
        if got is None:
            return False
        try:
            return int(json.loads(got)["version"]) > self.version
        except (ValueError, KeyError, TypeError):
            return False  # a torn or foreign pointer: the log itself is still read forward

    def _read_from_listing(self) -> bool:
        commits: set[int] = set()
        parts: dict[int, dict[int, tuple[int, str]]] = {}
        try:
            entries = list(self.objects.list_objects(f"{LOG}/"))
        except LandingError as exc:
            raise TableError(f"{self.objects.location}: listing the Delta log: {exc}") from None
        for info in entries:
            name = info.key.rsplit("/", 1)[-1]
            if m := _COMMIT.match(name):
                commits.add(int(m.group(1)))
            elif m := _CHECKPOINT.match(name):
                part, of = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, 1)
                parts.setdefault(int(m.group(1)), {})[part] = (of, info.key)
        whole = [v for v, p in parts.items() if all(of == len(p) for of, _ in p.values())]
        if not commits and not whole:
            self.version = -1
            return False
        self.txns, self.configuration = {}, {}
        self.protocol = (READER_VERSION, WRITER_VERSION)
        if whole:
            at = max(whole)
            for _of, key in sorted(parts[at].values(), key=lambda t: t[1]):
                self._read_checkpoint(key)
            self.version = at
        elif 0 not in commits:
            raise TableError(
                f"{self.objects.location}: the Delta log starts at version {min(commits)} without a "
                "checkpoint; the table cannot be read"
            )
        self._read_forward()
        return True

    def _read_checkpoint(self, key: str) -> None:
        body = self._get(key)
        if body is None:
            raise TableError(f"{key}: the checkpoint went while it was read (expired?)")
        table = pq.read_table(io.BytesIO(body), columns=["txn", "protocol", "metaData"])
        for row in table.column("txn").to_pylist():
            if row is not None:
                self.txns[str(row["appId"])] = int(row["version"])
        for row in table.column("protocol").to_pylist():
            if row is not None:
                self.protocol = (int(row["minReaderVersion"]), int(row["minWriterVersion"]))
        for row in table.column("metaData").to_pylist():
            if row is not None:
                conf = row.get("configuration") or {}
                items = conf.items() if isinstance(conf, dict) else conf  # a map reads as pairs
                self.configuration = {str(k): str(v) for k, v in items}

    def _read_forward(self) -> None:
        while (body := self._get(commit_key(self.version + 1))) is not None:
            self._apply(parse_commit(self.version + 1, body))

    def _apply(self, commit: Commit) -> None:
        self.txns.update(commit.apps)
        if commit.protocol is not None:
            self.protocol = commit.protocol
        if commit.configuration is not None:
            self.configuration = commit.configuration
        self.version = commit.version

    def _get(self, key: str) -> bytes | None:
        try:
            got = self.objects.get(key)
        except LandingError as exc:
            raise TableError(f"reading {key}: {exc}") from None
        return None if got is None else got[0]

    # -- writing -----------------------------------------------------------------------------------

    def commit(self, actions: Iterable[dict[str, Any]], commit_info: dict[str, Any]) -> int:
        """Append ``actions`` (after a commitInfo of ``commit_info``) as the next version; the
        version written. StaleCommit when a commit since the version read holds a txn of an
        appId among ``actions``; TableError otherwise."""
        reader, writer = self.protocol
        if reader > READER_VERSION or writer > WRITER_VERSION:
            raise TableError(
                f"{self.objects.location}: the table's protocol asks for reader {reader} / writer "
                f"{writer}; mqd's committer writes reader {READER_VERSION} / writer {WRITER_VERSION}"
            )
        if self.version < 0:
            raise TableError(f"{self.objects.location}: no Delta log read; refresh() first")
        actions = list(actions)
        mine = {str(a["txn"]["appId"]): int(a["txn"]["version"]) for a in actions if "txn" in a}
        nonce, body = _entry(actions, commit_info)
        for _ in range(self.max_retries + 1):
            version = self.version + 1
            theirs = self._put(version, body)
            if theirs is None or theirs.nonce == nonce:
                self._apply(Commit(version, mine))
                return version
            self._apply(theirs)
            if mine.keys() & theirs.apps.keys():
                raise StaleCommit(
                    f"{commit_key(version)}: another committer added files of "
                    f"{sorted(mine.keys() & theirs.apps.keys())[0]} since version {version - 1}"
                )
        raise TableError(f"{self.objects.location}: no free version after {self.max_retries} tries")

    def create(self, actions: Iterable[dict[str, Any]], commit_info: dict[str, Any]) -> bool:
        """Write ``actions`` (after a commitInfo of ``commit_info``) as version 0, create-only:
        True when this call made the table, False when another writer had (``refresh`` reads it)."""
        nonce, body = _entry(actions, commit_info)
        theirs = self._put(0, body)
        return theirs is None or theirs.nonce == nonce

    def _put(self, version: int, body: bytes) -> Commit | None:
        """Put ``body`` as ``version`` create-only: None when it took the name, else the commit
        found there (which may be this one, when the answer to a put that took effect was lost)."""
        key = commit_key(version)
        try:
            self.objects.put(key, body, if_absent=True)
            return None
        except PreconditionFailed:
            pass
        except LandingError:
            pass  # uncertain: whatever is there now says whether it was ours
        found = self._get(key)
        if found is None:
            raise TableError(f"{key}: the put failed and nothing is there; retried next round")
        return parse_commit(version, found)


def _entry(actions: Iterable[dict[str, Any]], commit_info: dict[str, Any]) -> tuple[str, bytes]:
    """A log entry of ``actions`` after a commitInfo of ``commit_info`` with a fresh nonce (how a
    writer knows its own entry when the answer to its put was lost); the nonce and the entry."""
    nonce = secrets.token_hex(12)
    lines = [{"commitInfo": {**commit_info, "mqd.commit": nonce}}, *actions]
    return nonce, "\n".join(json.dumps(a, separators=(",", ":")) for a in lines).encode() + b"\n"
