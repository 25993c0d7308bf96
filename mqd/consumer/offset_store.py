"""Offset stores (RocketMQ's OffsetStore): where consumed positions are persisted.

The caller marks what it has durably handled (``mark``: forward-only); ``persist`` writes every mark
that is ahead of what was last persisted. The one way back is ``rewind``: the partition's log was
replaced from an offset on (a new log incarnation: a recreated topic, a truncation), so the mark
moves back there and is persisted although lower, as Kafka's own consumer moves its position and
commits after a truncation; marks of the old log still in flight (publications of records fetched
from it) are ignored, so they cannot raise it to the old log's end again.

Cluster mode commits where the source says (its ``consumer_group``: for the mqd broker, the group's
coordinator broker, which itself only moves forward unless a commit is forced, so it keeps the old
log's end after a rewind until the new log's marks pass it); broadcast mode keeps a local JSON file
whatever the source, written atomically (mqd.fsutil.atomic_write) with a ``.bak`` copy of the
previous version, and read back on start (falling back to the ``.bak`` when the main file is
damaged).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from mqd import metrics
from mqd.consumer.errors import ConsumerError
from mqd.fsutil import atomic_write
from mqd.topic_partition import TopicPartition

log = structlog.get_logger("mqd.consumer.offsets")


class OffsetStore:
    """Marks (in memory) and their persisted copy. Subclasses implement the I/O."""

    def __init__(self) -> None:
        self._marked: dict[TopicPartition, int] = {}
        self._persisted: dict[TopicPartition, int] = {}
        # rewound marks to persist although not ahead of the persisted offset, and the number of
        # rewinds per partition (a write in flight during a rewind must not count as persisting it)
        self._rewound: set[TopicPartition] = set()
        self._rewinds: dict[TopicPartition, int] = {}
        # per rewound partition (where the logs part, low, high): a mark in low+1..high may be a
        # late one of the old log
        self._stale: dict[TopicPartition, tuple[int, int, int]] = {}
        self.last_error: str | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def mark(self, tp: TopicPartition, next_offset: int) -> None:
        """Record that everything before ``next_offset`` is consumed; never moves backwards. After
        a ``rewind``, a mark that may be a late one of the old log is ignored (see there)."""
        if isinstance(next_offset, bool) or not isinstance(next_offset, int) or next_offset < 0:
            raise ValueError(f"{tp}: cannot mark {next_offset!r} consumed: offsets are integers >= 0")
        stale = self._stale.get(tp)
        if stale is not None:
            floor, low, high = stale
            if low < next_offset <= high:
                # the old log's fetched records end at high and were marked up to low: this may
                # be a later one of them (a partition's publications end in order, each mark above
                # the one before)
                if next_offset < high:
                    self._stale[tp] = (floor, next_offset, high)
                else:
                    del self._stale[tp]  # the old log's last fetched record: no mark of it follows
                return
            if next_offset > floor:
                del self._stale[tp]  # the new log's: the old log's marks all came before it
            # else: below where the logs part, the same records in both: taken, and still watching
        if next_offset > self._marked.get(tp, -1):
            self._marked[tp] = next_offset

    def rewind(self, tp: TopicPartition, next_offset: int, old_end: int) -> None:
        """``tp``'s log was replaced from ``next_offset`` on (a new incarnation; the old one's
        records before ``next_offset`` are the new one's too) and records of the old log were
        fetched up to ``old_end``. A mark past ``next_offset`` moves back to it and is persisted
        next although lower (Kafka's coordinator takes it; the mqd broker's ignores a commit below
        the stored offset). Marks of the old log still to come (its fetched records landing after
        this) lie above what was marked and at or below ``old_end``: they are ignored, so they
        cannot move the mark up to the old end again. A mark outside that range is the new log's,
        and since a partition's publications end in order, the old log's are over then.

        Marks of the new log that happen to fall in the range before the old log's last one is seen
        are ignored too (records of both logs in one publication): the mark then stays behind (lag
        overstated, never understated) until a mark beyond ``old_end``."""
        if next_offset < 0 or old_end < 0:
            raise ValueError(f"{tp}: cannot rewind to {next_offset!r} (old end {old_end!r})")
        prior = self._marked.get(tp)
        if prior is not None and prior > next_offset:
            self._marked[tp] = next_offset
            self._rewound.add(tp)
            self._rewinds[tp] = self._rewinds.get(tp, 0) + 1
        low = next_offset if prior is None else max(prior, next_offset)
        if low < old_end:
            stale = self._stale.get(tp)
            if stale is not None:  # rewound again before the old marks of the first rewind ended
                low, old_end = min(low, stale[1]), max(old_end, stale[2])
            self._stale[tp] = (next_offset, low, old_end)
        else:
            self._stale.pop(tp, None)

    def marked(self, tp: TopicPartition) -> int | None:
        return self._marked.get(tp)

    def committed(self, tp: TopicPartition) -> int | None:
        """What is known to be persisted (read on load or written by persist)."""
        return self._persisted.get(tp)

    def pending(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Marks ahead of what was persisted, and rewound ones."""
        keys = self._marked.keys() if tps is None else [tp for tp in tps if tp in self._marked]
        return {
            tp: self._marked[tp]
            for tp in keys
            if tp in self._rewound or self._marked[tp] > self._persisted.get(tp, -1)
        }

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop marks that were persisted (a revoked partition); keep the ones still pending."""
        for tp in tps:
            self._stale.pop(tp, None)
            if tp not in self.pending([tp]):
                self._marked.pop(tp, None)

    def _written(self, written: dict[TopicPartition, int], rewinds: dict[TopicPartition, int]) -> None:
        """``written`` (taken from ``pending`` when the rewind counts were ``rewinds``) is persisted:
        what is persisted now, and which rewound marks are done (not rewound again meanwhile)."""
        for tp, off in written.items():
            if tp in self._rewound:
                self._persisted[tp] = off
                if self._rewinds.get(tp, 0) == rewinds.get(tp, 0):
                    self._rewound.discard(tp)
            else:
                self._persisted[tp] = max(off, self._persisted.get(tp, -1))

    async def load(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Persisted offsets of ``tps`` (absent when never persisted). Raises when the store cannot
        be read: the caller must not fall back to consume_from for a partition that may have one."""
        raise NotImplementedError

    async def persist(self, tps: Iterable[TopicPartition] | None = None) -> int:
        """Write pending marks (of ``tps``, default all); returns how many were written."""
        raise NotImplementedError


class CoordinatorOffsetStore(OffsetStore):
    """Cluster mode: offsets committed on the consumer group's coordinator (the mqd broker's or
    Kafka's). A subclass says how to read and write them on the wire; the bookkeeping (one commit
    at a time, forward-only persisted copy but for a rewind, read back after one, metrics,
    ``last_error``) is here."""

    commit_errors: tuple[type[Exception], ...] = (ConsumerError,)  # what a failed commit raises

    def __init__(self) -> None:
        super().__init__()
        self._lock = asyncio.Lock()  # one commit at a time keeps them ordered

    async def _read_committed(self, tps: list[TopicPartition]) -> Iterable[tuple[TopicPartition, int]]:
        """The coordinator's committed offsets (-1: none) of ``tps``; raises a ConsumerError."""
        raise NotImplementedError

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` on the coordinator; raises one of ``commit_errors``."""
        raise NotImplementedError

    async def load(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        wanted = set(tps)
        out: dict[TopicPartition, int] = {}
        for tp, offset in await self._read_committed(tps):
            if tp in wanted and offset >= 0:
                out[tp] = offset
                self._persisted[tp] = max(offset, self._persisted.get(tp, -1))
        return out

    async def persist(self, tps: Iterable[TopicPartition] | None = None) -> int:
        async with self._lock:
            todo = self.pending(tps)
            if not todo:
                return 0
            rewinds = dict(self._rewinds)
            lowered = [tp for tp in todo if tp in self._rewound]
            t0 = time.perf_counter()
            try:
                await self._commit(todo)
            except self.commit_errors as exc:
                metrics.commits.labels("error").inc()
                self.last_error = str(exc)
                raise ConsumerError(f"offset commit failed: {exc}", retriable=True) from exc
            metrics.commit_latency.observe(time.perf_counter() - t0)
            metrics.commits.labels("ok").inc()
            self.last_error = None
            self._written(todo, rewinds)
            if lowered:
                await self._read_back(lowered)
            return len(todo)

    async def _read_back(self, tps: list[TopicPartition]) -> None:
        """Rewound marks were committed: a coordinator that only moves forward (the mqd broker's,
        unless a commit is forced) kept its higher offset; what it holds is what is committed, and
        marks are committed again once past it."""
        try:
            held = dict(await self._read_committed(tps))
        except ConsumerError as exc:
            log.warning("committed offsets not read back after a rewind", error=str(exc))
            return
        for tp in tps:
            off = held.get(tp, -1)
            if tp in self._rewound or off <= self._persisted.get(tp, -1):
                continue  # rewound again meanwhile (committed next), or the lower one was taken
            log.warning(
                "the coordinator kept a committed offset above the rewound mark",
                topic=tp.topic,
                partition=tp.partition,
                committed=off,
                marked=self._marked.get(tp),
            )
            self._persisted[tp] = off


class LocalFileOffsetStore(OffsetStore):
    """Broadcast mode: ``{"version": 1, "offsets": {"topic": {"partition": offset}}}`` on local disk."""

    VERSION = 1

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.backup = self.path.with_name(self.path.name + ".bak")
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._persisted.update(await asyncio.to_thread(self._read_best))

    async def load(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._persisted[tp] for tp in tps if tp in self._persisted}

    async def persist(self, tps: Iterable[TopicPartition] | None = None) -> int:
        async with self._lock:
            todo = self.pending(tps)
            if not todo:
                return 0
            rewinds = dict(self._rewinds)
            snapshot = dict(self._persisted)
            for tp, off in todo.items():
                snapshot[tp] = off if tp in self._rewound else max(off, snapshot.get(tp, -1))
            t0 = time.perf_counter()
            try:
                await asyncio.to_thread(self._write, snapshot)
            except OSError as exc:
                metrics.commits.labels("error").inc()
                self.last_error = f"{self.path}: {exc}"
                raise ConsumerError(f"cannot write offset file {self.path}: {exc}", retriable=True) from exc
            metrics.commit_latency.observe(time.perf_counter() - t0)
            metrics.commits.labels("ok").inc()
            self.last_error = None
            self._persisted = snapshot
            self._written(todo, rewinds)
            return len(todo)

    # -- file I/O (worker thread) ----------------------------------------------------------------

    @classmethod
    def _parse(cls, raw: bytes) -> dict[TopicPartition, int]:
        data: Any = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != cls.VERSION:
            raise ValueError("not an mqd offset file (version 1)")
        out: dict[TopicPartition, int] = {}
        for topic, parts in data["offsets"].items():
            for partition, offset in parts.items():
                if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                    raise ValueError(f"bad offset {offset!r} for {topic}/{partition}")
                out[TopicPartition(str(topic), int(partition))] = offset
        return out

    def _read_best(self) -> dict[TopicPartition, int]:
        for path in (self.path, self.backup):
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                offsets = self._parse(raw)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("offset file is damaged, trying the backup", path=str(path), error=str(exc))
                continue
            if path == self.backup:
                log.warning("offsets read from the backup copy", path=str(path))
            return offsets
        if self.path.exists() or self.backup.exists():
            raise ConsumerError(
                f"{self.path}: offset file and its backup are both unreadable; move them away to "
                "start from consume_from",
                retriable=False,
            )
        return {}

    def _write(self, offsets: dict[TopicPartition, int]) -> None:
        doc: dict[str, dict[str, int]] = {}
        for tp in sorted(offsets):
            doc.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
        raw = json.dumps({"version": self.VERSION, "offsets": doc}, indent=1, sort_keys=True).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            # the previous good version becomes the backup (atomically, by a hard link + rename)
            bak_tmp = self.backup.with_name(f".{self.backup.name}.{os.getpid()}.tmp")
            try:
                os.unlink(bak_tmp)
            except FileNotFoundError:
                pass
            os.link(self.path, bak_tmp)
            os.replace(bak_tmp, self.backup)
        atomic_write(self.path, raw)
