"""Consumer groups on the coordinator: membership (in memory) and committed offsets (durable).

Membership follows RocketMQ's cidAll: a heartbeat registers a client id (with its topics), the answer
is the sorted member list and a version that grows on every change (join, leave, expiry, changed
topics). Members silent for their session timeout are dropped by :meth:`GroupStore.expire`.

Committed offsets live in ``<data_dir>/offsets.json``, replaced atomically (temp file, fsync, rename,
directory fsync) on every commit batch; commits only move forward unless forced. Slaves pull the
master's snapshot and max-merge it (:meth:`merge_offsets`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

OFFSETS_FILE = "offsets.json"


class GroupError(Exception):
    """The offsets file cannot be read or written."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(slots=True)
class _Member:
    topics: tuple[str, ...]
    session_timeout: float  # seconds
    last_seen: float  # monotonic


@dataclass(slots=True)
class _Group:
    members: dict[str, _Member] = field(default_factory=dict)
    version: int = 0

    def sorted_members(self) -> list[str]:
        return sorted(self.members)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupStore:
    """Group membership (in memory) and committed offsets (durable: data_dir/offsets.json written
    atomically + fsync, replaced on every commit batch)."""

    def __init__(self, data_dir: Path) -> None:
        self._path = Path(data_dir) / OFFSETS_FILE
        self._groups: dict[str, _Group] = {}
        self._offsets: dict[str, dict[tuple[str, int], int]] = {}
        self._write_lock = asyncio.Lock()

    # -- persistence -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the offsets file (blocking; call at start). A missing file means no commits yet."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        for stale in self._path.parent.glob(f"{self._path.name}.*.tmp"):
            stale.unlink(missing_ok=True)  # left by a crash before its rename
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise GroupError(f"{self._path}: cannot read: {exc}", retriable=False) from exc
        try:
            data = json.loads(raw)
            groups = data["groups"]
            loaded = {
                str(g): {(str(e["topic"]), int(e["partition"])): int(e["offset"]) for e in entries}
                for g, entries in groups.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # the file is only ever replaced by rename, so this is outside damage: refuse to guess
            raise GroupError(f"{self._path}: corrupt offsets file: {exc}", retriable=False) from exc
        self._offsets = loaded

    def _write(self, snapshot: dict[str, list[dict[str, Any]]]) -> None:
        # unique temp name: a slave acting as coordinator may write from a commit and a merge at once
        tmp = self._path.with_name(f"{self._path.name}.{uuid.uuid4().hex}.tmp")
        body = json.dumps({"version": 1, "groups": snapshot}, separators=(",", ":")).encode()
        try:
            with open(tmp, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._path)
            _fsync_dir(self._path.parent)
        except OSError as exc:
            raise GroupError(f"{self._path}: cannot write: {exc}", retriable=True) from exc

    # -- committed offsets -------------------------------------------------------------------------

    def offsets_snapshot(self) -> dict[str, list[dict[str, Any]]]:
        return {
            g: [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(offs.items())]
            for g, offs in sorted(self._offsets.items())
        }

    def merge_offsets(self, snapshot: dict[str, list[dict[str, Any]]]) -> None:
        """Max-merge a master's snapshot (slave pull); written durably when anything moved."""
        changed = False
        for g, entries in snapshot.items():
            offs = self._offsets.setdefault(str(g), {})
            for e in entries:
                key = (str(e["topic"]), int(e["partition"]))
                offset = int(e["offset"])
                if offset > offs.get(key, -1):
                    offs[key] = offset
                    changed = True
        if changed:
            self._write(self.offsets_snapshot())

    async def commit(
        self, group: str, offsets: list[tuple[str, int, int]], force: bool
    ) -> list[dict[str, Any]]:
        """Store ``(topic, partition, offset)`` commits; returns what is stored for each afterwards.

        A commit below the stored offset is ignored unless ``force``. The answer is sent only after
        the file is on disk (fsync in a worker thread).
        """
        async with self._write_lock:
            offs = self._offsets.setdefault(group, {})
            changed = False
            for topic, partition, offset in offsets:
                key = (topic, partition)
                if force or offset > offs.get(key, -1):
                    changed = changed or offs.get(key) != offset
                    offs[key] = offset
            if changed:
                snapshot = self.offsets_snapshot()
                await asyncio.get_running_loop().run_in_executor(None, self._write, snapshot)
            return [{"topic": t, "partition": p, "offset": offs[(t, p)]} for t, p, _ in offsets]

    def committed(self, group: str, partitions: list[tuple[str, int]]) -> list[dict[str, Any]]:
        offs = self._offsets.get(group, {})
        keys = partitions or sorted(offs)
        return [{"topic": t, "partition": p, "offset": offs[(t, p)]} for t, p in keys if (t, p) in offs]

    # -- membership --------------------------------------------------------------------------------

    def heartbeat(
        self, group: str, client_id: str, topics: list[str], session_timeout_ms: int
    ) -> tuple[list[str], int]:
        g = self._groups.setdefault(group, _Group())
        now = time.monotonic()
        member = g.members.get(client_id)
        topic_set = tuple(sorted(set(topics)))
        if member is None or member.topics != topic_set:
            g.version += 1
            log.info("group member joined" if member is None else "group member changed topics",
                     group=group, client_id=client_id, version=g.version)
        g.members[client_id] = _Member(topic_set, session_timeout_ms / 1000, now)
        return g.sorted_members(), g.version

    def leave(self, group: str, client_id: str) -> tuple[list[str], int]:
        g = self._groups.setdefault(group, _Group())
        if g.members.pop(client_id, None) is not None:
            g.version += 1
            log.info("group member left", group=group, client_id=client_id, version=g.version)
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

    def members(self, group: str) -> tuple[list[str], int]:
        g = self._groups.get(group)
        return (g.sorted_members(), g.version) if g else ([], 0)
