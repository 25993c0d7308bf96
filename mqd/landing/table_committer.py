"""The landing table's committer: what the claim chains published, added to the Delta log
(delta_log.py) a few seconds later, exactly once, by whichever daemon gets there first.

The claim chains stay the truth of publication; the table follows them. The daemon tells the
committer which partitions changed (``note``: a publication of this daemon; ``track``: a partition
it now owns, whose chain may hold files nobody committed: a daemon killed between publication and
commit, a previous owner, a table switched on over an existing landing). A *round* then:

1. reads each changed chain read-only and incrementally (chain_reader.py: only the claims after
   the last one read; a newest claim whose file is not visible yet waits for the next round) and
   keeps its new files as candidates, in chain order;
2. reads the Delta log up to its newest version and drops every candidate the log already holds
   (its incarnation's ``txn`` version at or past the file's last offset: another committer's work,
   or a commit of ours whose answer was lost);
3. adds what is left, for every partition at once, in ONE commit with one ``txn`` per (topic,
   partition, incarnation), version = the last offset added.

A committer that is stale (a frozen owner resumed after its session expired, a second daemon that
read the log before the first committed) computes the same missing files from an older version:
delta-rs refuses its commit, since a commit that landed after the version it read holds a ``txn``
of the same appId. The round is dropped, counted (``mqd_landing_table_commits_dropped``) and
logged; the next round reads the log again and finds nothing (or only what is still missing).

A candidate whose appId was never committed is checked to exist first: a file the lifecycle
deleted before the table existed is skipped, counted and logged, never added as a dangling path.

Rounds run on the committer's own thread, one at a time: every ``commit_interval`` or once
``commit_files`` files were published, and before the daemon exits (``flush``: a burst run and
every stop commit what they published).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import structlog

from mqd import metrics
from mqd.daemon_threads import DaemonThreadExecutor
from mqd.errors import MqdError
from mqd.landing.chain_reader import ChainReader
from mqd.landing.delta_log import LandingTable, app_id
from mqd.landing.errors import ChainBroken, LandingCorrupt, LandingError, StaleCommit, TableError
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects

log = structlog.get_logger("mqd.landing")

TP = tuple[str, int]


@dataclass(slots=True)
class CommitStats:
    """Counters since start (the status JSON's ``landing.table``)."""

    commits: int = 0  # commits that landed
    files: int = 0  # files added by them
    records: int = 0
    dropped: int = 0  # commits refused as stale (another committer got there first)
    errors: int = 0  # rounds that failed otherwise (retried next round)
    gone: int = 0  # candidates skipped: deleted before any commit of their appId
    last_commit_ms: float | None = None  # duration of the last commit
    last_files: int = 0  # files in the last commit
    version: int | None = None  # table version after the last round
    cpu_s: float = 0.0  # CPU time of the committer's thread in rounds (what the table costs)


@dataclass(slots=True)
class RoundResult:
    files: int = 0
    version: int | None = None
    stale: bool = False
    error: str | None = None
    pending: bool = False  # a chain's newest file was not visible yet: look again next round


class TableCommitter:
    """See the module docstring. ``note``/``track``/``due``/``start``/``flush`` run on the event
    loop; rounds run on the committer's thread."""

    def __init__(
        self,
        objects: Objects,
        table: LandingTable,
        *,
        interval: float = 5.0,
        max_files: int = 1000,
        name: str = "",
    ) -> None:
        self.objects = objects
        self.table = table
        self.interval = interval
        self.max_files = max_files
        self.name = name  # written into each commit's info (which daemon committed)
        self.reader = ChainReader(objects)
        self.stats = CommitStats()
        self.error: str | None = None  # the last round's failure (None once a round succeeds)
        self._dirty: set[TP] = set()  # chains to read again (loop thread)
        self._noted = 0  # files published since the last round started
        self._next = 0.0  # monotonic time the next round is due by the interval
        self._pending: dict[TP, list[FileRange]] = {}  # candidates not committed yet (round thread)
        self._task: asyncio.Task[None] | None = None
        self._executor = DaemonThreadExecutor(1, thread_name_prefix="mqd-landing-table")

    # -- the event loop's side ---------------------------------------------------------------------

    def note(self, tp: TP, published: list[FileRange]) -> None:
        """``published`` landed in ``tp``'s chain (a publication of this daemon)."""
        if published:
            self._dirty.add((tp[0], tp[1]))
            self._noted += len(published)

    def track(self, tp: TP) -> None:
        """This daemon owns ``tp`` now: its chain is read in the next round."""
        self._dirty.add((tp[0], tp[1]))
        self._next = min(self._next, time.monotonic())  # catch up now, not an interval later

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def due(self, now: float) -> bool:
        if self.running or not (self._dirty or any(self._pending.values())):
            return False
        return now >= self._next or self._noted >= self.max_files

    def start(self, now: float | None = None) -> None:
        """Start a round in the background when one is due (one at a time)."""
        if self.due(time.monotonic() if now is None else now):
            self._task = asyncio.create_task(self._run_round(), name="mqd-landing-table")

    async def _run_round(self) -> None:
        dirty, self._dirty = self._dirty, set()
        self._noted = 0
        self._next = time.monotonic() + self.interval
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(self._executor, self.round, dirty)
        if res.pending or res.error is not None:
            self._dirty.update(dirty)  # a head not visible yet, or a chain not read: read them again

    async def flush(self, tps: set[TP] | None = None, *, rounds: int = 4) -> bool:
        """Commit everything published so far (``tps``: those chains as well): waits for a
        running round, then runs rounds until nothing is missing (a round dropped as stale is
        followed by another). True when the table holds every visible file of those chains."""
        if self._task is not None:
            await asyncio.shield(self._task)
        self._dirty.update(tps or ())
        loop = asyncio.get_running_loop()
        for _ in range(rounds):
            dirty, self._dirty = self._dirty, set()
            self._noted = 0
            res = await loop.run_in_executor(self._executor, self.round, dirty)
            if res.error is None and not res.stale and not res.pending and not any(self._pending.values()):
                return True
            self._dirty.update(dirty)
        return False

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {
            "format": "delta",
            "uri": self.table.uri,
            "version": s.version,
            "commits": s.commits,
            "files": s.files,
            "records": s.records,
            "dropped_stale": s.dropped,
            "errors": s.errors,
            "skipped_gone": s.gone,
            "last_commit_ms": None if s.last_commit_ms is None else round(s.last_commit_ms, 1),
            "last_commit_files": s.last_files,
            "cpu_s": round(s.cpu_s, 3),
            "pending_files": sum(len(v) for v in self._pending.values()),
            "error": self.error,
        }

    # -- a round (the committer's thread) ----------------------------------------------------------

    def round(self, dirty: set[TP]) -> RoundResult:
        """Read the changed chains, the log, and add what is missing in one commit (module
        docstring). Never raises for the store or the log: the result says what happened."""
        cpu0 = time.thread_time()
        try:
            return self._round(dirty)
        finally:
            self.stats.cpu_s += time.thread_time() - cpu0

    def _round(self, dirty: set[TP]) -> RoundResult:
        res = RoundResult()
        try:
            res.pending = self._read_chains(dirty)
            if not any(self._pending.values()):
                return res
            self.table.load()
            todo: list[FileRange] = []
            for tp in sorted(self._pending):
                keep = [f for f in self._pending[tp] if not self.table.committed(f)]
                keep = self._existing(keep)
                self._pending[tp] = keep
                todo.extend(keep)
            self._pending = {tp: v for tp, v in self._pending.items() if v}
            if not todo:
                res.version = self.stats.version = self.table.version
                self.error = None
                return res
            t0 = time.monotonic()
            version = self.table.add(todo, committer=self.name)
            took = time.monotonic() - t0
        except StaleCommit as exc:
            self.stats.dropped += 1
            metrics.landing_table_commits_dropped.inc()
            log.warning(
                "landing table commit dropped: another committer added these partitions' files first",
                files=len(todo),
                partitions=len({(f.topic, f.partition) for f in todo}),
                error=str(exc),
            )
            res.stale = True
            return res
        except (TableError, LandingError, LandingCorrupt, OSError, MqdError) as exc:
            self.stats.errors += 1
            metrics.landing_table_errors.inc()
            if self.error is None:
                log.error("landing table commit failed; retried next round", error=str(exc))
            self.error = f"{type(exc).__name__}: {exc}"
            res.error = self.error
            return res
        committed = {(f.topic, f.partition) for f in todo}
        for tp in committed:
            self._pending.pop(tp, None)
        s = self.stats
        s.commits += 1
        s.files += len(todo)
        s.records += sum(f.count for f in todo)
        s.last_commit_ms, s.last_files, s.version = took * 1000, len(todo), version
        metrics.landing_table_commits.inc()
        metrics.landing_table_files.inc(len(todo))
        metrics.landing_table_commit_latency.observe(took)
        self.error = None
        res.files, res.version = len(todo), version
        log.debug("landing table commit", version=version, files=len(todo), ms=round(took * 1000, 1))
        return res

    def _read_chains(self, dirty: set[TP]) -> bool:
        """New files of the ``dirty`` chains into the candidates; True when a chain's newest
        file is not visible yet."""
        pending = False
        for tp, view in self.reader.refresh_chains(sorted(dirty)):
            if isinstance(view, ChainBroken):
                # the daemon stops the partition and says so; nothing past the break is added
                log.warning(
                    "landing table: chain broken, partition not committed",
                    tp=f"{tp[0]}/{tp[1]}",
                    error=str(view),
                )
                continue
            if view.files:
                self._pending.setdefault(tp, []).extend(view.files)
                view.files.clear()  # the reader keeps its place (seq, state), not every range
            pending = pending or view.pending is not None
        return pending

    def _existing(self, files: list[FileRange]) -> list[FileRange]:
        """``files`` without those of a never-committed appId whose file is gone (counted); a
        range without its size (landed by an old mqd, migrated) gets it from the store."""
        out = []
        for f in files:
            if self.table.txn_version(app_id(f.topic, f.partition, f.incarnation)) is None or f.bytes <= 0:
                info = self.objects.head(f.path)
                if info is None:
                    self.stats.gone += 1
                    metrics.landing_table_files_gone.inc()
                    log.warning(
                        "landed file gone before the landing table held it (deleted before the "
                        "table existed?); not added",
                        path=f.path,
                        first_offset=f.first_offset,
                        last_offset=f.last_offset,
                        records=f.count,
                    )
                    continue
                if f.bytes <= 0:
                    f = dataclasses.replace(f, bytes=info.size)
            out.append(f)
        return out
