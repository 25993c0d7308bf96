"""Offset stores (RocketMQ's OffsetStore): where consumed positions are persisted.

The caller marks what it has durably handled (``mark``: forward-only); ``persist`` writes every mark
that is ahead of what was last persisted. Cluster mode commits where the source says (its
``consumer_group``: for the mqd broker, the group's coordinator broker, which itself only moves
forward); broadcast mode keeps a local JSON file whatever the source, written atomically
(mqd.fsutil.atomic_write) with a ``.bak`` copy of the previous version, and read back on start
(falling back to the ``.bak`` when the main file is damaged).
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
        self.last_error: str | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def mark(self, tp: TopicPartition, next_offset: int) -> None:
        """Record that everything before ``next_offset`` is consumed; never moves backwards."""
        if isinstance(next_offset, bool) or not isinstance(next_offset, int) or next_offset < 0:
            raise ValueError(f"{tp}: cannot mark {next_offset!r} consumed: offsets are integers >= 0")
        if next_offset > self._marked.get(tp, -1):
            self._marked[tp] = next_offset

    def marked(self, tp: TopicPartition) -> int | None:
        return self._marked.get(tp)

    def committed(self, tp: TopicPartition) -> int | None:
        """What is known to be persisted (read on load or written by persist)."""
        return self._persisted.get(tp)

    def pending(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Marks ahead of what was persisted."""
        keys = self._marked.keys() if tps is None else [tp for tp in tps if tp in self._marked]
        return {tp: self._marked[tp] for tp in keys if self._marked[tp] > self._persisted.get(tp, -1)}

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Drop marks that were persisted (a revoked partition); keep the ones still pending."""
        for tp in tps:
            if tp not in self.pending([tp]):
                self._marked.pop(tp, None)

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
    at a time, forward-only persisted copy, metrics, ``last_error``) is here."""

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
            for tp, off in todo.items():
                self._persisted[tp] = max(off, self._persisted.get(tp, -1))
            return len(todo)


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
            snapshot = dict(self._persisted)
            for tp, off in todo.items():
                snapshot[tp] = max(off, snapshot.get(tp, -1))
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
