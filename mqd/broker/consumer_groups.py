"""Consumer groups on the coordinator: membership (in memory) and committed offsets (durable).

Membership follows RocketMQ's cidAll: a heartbeat registers a client id (with its topics), the answer
is the sorted member list and a version that grows on every change (join, leave, expiry, changed
topics). Members silent for their session timeout are dropped by :meth:`ConsumerGroupStore.expire`.

Committed offsets live in ``<data_dir>/offsets.json``, replaced with :func:`mqd.fsutil.atomic_write`
on every commit batch; commits only move forward unless forced.

Replication is a symmetric max-merge of snapshots: slaves pull the master's, and a master pulls its
slaves' (at start and every second), so commits a slave took as coordinator while the master was
down survive the master's return. Each stored offset carries an ``epoch`` that a forced commit
bumps; merges compare ``(epoch, offset)``, so a forced (backward) commit wins over the larger offset
the other nodes still hold instead of being undone by the next merge.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from mqd.errors import MqdError
from mqd.fsutil import atomic_write

log = structlog.get_logger(__name__)

OFFSETS_FILE = "offsets.json"
MAX_OFFSET = 2**63 - 1

# what is stored per (topic, partition): (epoch, offset), compared as a tuple by merges
Committed = tuple[int, int]
Snapshot = dict[str, list[dict[str, Any]]]


class ConsumerGroupError(MqdError):
    """The offsets file cannot be read or written."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message, retriable=retriable)


@dataclass(slots=True)
class _Member:
    topics: tuple[str, ...]
    session_timeout: float  # seconds
    last_seen: float  # monotonic


@dataclass(slots=True)
class _ConsumerGroup:
    members: dict[str, _Member] = field(default_factory=dict)
    version: int = 0

    def sorted_members(self) -> list[str]:
        return sorted(self.members)


class ConsumerGroupStore:
    """Group membership (in memory) and committed offsets (durable: data_dir/offsets.json written
    atomically + fsync, replaced on every commit batch)."""

    def __init__(self, data_dir: Path) -> None:
        self._path = Path(data_dir) / OFFSETS_FILE
        self._groups: dict[str, _ConsumerGroup] = {}
        self._offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self._write_lock = asyncio.Lock()
        # snapshots are numbered in the order the loop took them; a write never replaces the file
        # with an older snapshot than the last one written (a commit's and a merge's writes may race)
        self._write_seq = 0
        self._written_seq = 0
        self._replace_lock = threading.Lock()

    # -- persistence -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the offsets file (blocking; call at start). A missing file means no commits yet."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # left by a crash before the rename (the second pattern is the temp name of older versions)
        for pattern in (f".{self._path.name}.*.tmp", f"{self._path.name}.*.tmp"):
            for stale in self._path.parent.glob(pattern):
                stale.unlink(missing_ok=True)
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConsumerGroupError(f"{self._path}: cannot read: {exc}", retriable=False) from exc
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            loaded = parse_snapshot(data["groups"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # the file is only ever replaced by rename, so this is outside damage: refuse to guess
            raise ConsumerGroupError(f"{self._path}: corrupt offsets file: {exc}", retriable=False) from exc
        self._offsets = loaded

    def _snapshot_for_write(self) -> tuple[int, Snapshot]:
        self._write_seq += 1
        return self._write_seq, self.offsets_snapshot()

    def _write(self, seq: int, snapshot: Snapshot) -> None:
        body = json.dumps({"version": 1, "groups": snapshot}, separators=(",", ":")).encode()
        # held across the whole write: a commit and a merge may write at the same time, and
        # atomic_write's temp name is per process
        with self._replace_lock:
            if seq <= self._written_seq:
                return  # a newer snapshot (which holds this one's changes) is on disk
            try:
                atomic_write(self._path, body)
            except OSError as exc:
                raise ConsumerGroupError(f"{self._path}: cannot write: {exc}", retriable=True) from exc
            self._written_seq = seq

    # -- committed offsets -------------------------------------------------------------------------

    def offsets_snapshot(self) -> Snapshot:
        """Every group's committed offsets (GET /v1/replica/offsets, the file); ``epoch`` only
        where a forced commit set one (absent means 0, the shape from before epochs)."""
        return {
            g: [
                {"topic": t, "partition": p, "offset": o, **({"epoch": e} if e else {})}
                for (t, p), (e, o) in sorted(offs.items())
            ]
            for g, offs in sorted(self._offsets.items())
        }

    def _merge(self, snapshot: Any) -> bool:
        """Max-merge ``(epoch, offset)`` of a peer's snapshot into memory; True when anything moved."""
        parsed = parse_snapshot(snapshot)  # all or nothing: a malformed snapshot changes nothing
        changed = False
        for g, entries in parsed.items():
            offs = self._offsets.setdefault(g, {})
            for key, value in entries.items():
                if value > offs.get(key, (-1, -1)):
                    offs[key] = value
                    changed = True
        return changed

    def merge_offsets(self, snapshot: Any) -> None:
        """Max-merge a peer's snapshot (blocking write when anything moved; the slave's pull loop).

        Raises ValueError for a malformed snapshot (nothing merged), ConsumerGroupError when the write fails.
        """
        if self._merge(snapshot):
            self._write(*self._snapshot_for_write())

    async def merge(self, snapshot: Any) -> bool:
        """Like :meth:`merge_offsets`, with the write in a worker thread; True when anything moved."""
        if not self._merge(snapshot):
            return False
        seq, data = self._snapshot_for_write()
        await asyncio.get_running_loop().run_in_executor(None, self._write, seq, data)
        return True

    async def commit(
        self, consumer_group: str, offsets: list[tuple[str, int, int]], force: bool
    ) -> list[dict[str, Any]]:
        """Store ``(topic, partition, offset)`` commits; returns what is stored for each afterwards.

        A commit below the stored offset is ignored unless ``force``; a forced commit bumps the
        partition's epoch so it wins every later merge against the old offset. The answer is sent
        only after the file is on disk (fsync in a worker thread).
        """
        async with self._write_lock:
            offs = self._offsets.setdefault(consumer_group, {})
            changed = False
            for topic, partition, offset in offsets:
                key = (topic, partition)
                epoch, stored = offs.get(key, (0, -1))
                if force:
                    offs[key] = (epoch + 1, offset)
                    changed = True
                elif offset > stored:
                    offs[key] = (epoch, offset)
                    changed = True
            if changed:
                seq, snapshot = self._snapshot_for_write()
                await asyncio.get_running_loop().run_in_executor(None, self._write, seq, snapshot)
            return [{"topic": t, "partition": p, "offset": offs[(t, p)][1]} for t, p, _ in offsets]

    def committed(self, consumer_group: str, partitions: list[tuple[str, int]]) -> list[dict[str, Any]]:
        offs = self._offsets.get(consumer_group, {})
        keys = partitions or sorted(offs)
        return [{"topic": t, "partition": p, "offset": offs[(t, p)][1]} for t, p in keys if (t, p) in offs]

    # -- membership --------------------------------------------------------------------------------

    def heartbeat(
        self, consumer_group: str, client_id: str, topics: list[str], session_timeout_ms: int
    ) -> tuple[list[str], int]:
        g = self._groups.setdefault(consumer_group, _ConsumerGroup())
        now = time.monotonic()
        member = g.members.get(client_id)
        topic_set = tuple(sorted(set(topics)))
        if member is None or member.topics != topic_set:
            g.version += 1
            log.info(
                "group member joined" if member is None else "group member changed topics",
                group=consumer_group,
                client_id=client_id,
                version=g.version,
            )
        g.members[client_id] = _Member(topic_set, session_timeout_ms / 1000, now)
        return g.sorted_members(), g.version

    def leave(self, consumer_group: str, client_id: str) -> tuple[list[str], int]:
        g = self._groups.setdefault(consumer_group, _ConsumerGroup())
        if g.members.pop(client_id, None) is not None:
            g.version += 1
            log.info("group member left", group=consumer_group, client_id=client_id, version=g.version)
        return g.sorted_members(), g.version

    def expire(self, now: float | None = None) -> int:
        """Drop members silent for longer than their session timeout; returns how many."""
        now = time.monotonic() if now is None else now
        dropped = 0
        for name, g in self._groups.items():
            gone = [cid for cid, m in g.members.items() if now - m.last_seen > m.session_timeout]
            for cid in gone:
                del g.members[cid]
                log.info("group member expired", group=name, client_id=cid)
            if gone:
                g.version += 1
                dropped += len(gone)
        return dropped

    def min_session_timeout(self, default: float) -> float:
        timeouts = [m.session_timeout for g in self._groups.values() for m in g.members.values()]
        return min([default, *timeouts])

    def members(self, consumer_group: str) -> tuple[list[str], int]:
        g = self._groups.get(consumer_group)
        return (g.sorted_members(), g.version) if g else ([], 0)


def parse_snapshot(raw: Any) -> dict[str, dict[tuple[str, int], Committed]]:
    """Check and convert a snapshot ``{group: [{"topic", "partition", "offset", "epoch"?}]}``.

    ``epoch`` is optional (0): files and peers from before epochs existed. Raises ValueError naming
    the bad entry.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"offsets snapshot must be an object, got {type(raw).__name__}")
    out: dict[str, dict[tuple[str, int], Committed]] = {}
    for g, entries in raw.items():
        if not isinstance(entries, list):
            raise ValueError(f"group {g!r}: must be a list")
        offs: dict[tuple[str, int], Committed] = {}
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ValueError(f"group {g!r} entry {i}: must be an object")
            topic = e.get("topic")
            if not isinstance(topic, str) or not topic:
                raise ValueError(f"group {g!r} entry {i}: topic must be a non-empty string")
            partition, offset, epoch = (
                _non_negative(e.get(name, 0 if name == "epoch" else None), f"group {g!r} entry {i}: {name}")
                for name in ("partition", "offset", "epoch")
            )
            offs[(topic, partition)] = (epoch, offset)
        out[str(g)] = offs
    return out


def _non_negative(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise ValueError(f"{what} must be an integer in [0, 2**63), got {value!r}")
    return value
