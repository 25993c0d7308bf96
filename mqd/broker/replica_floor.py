"""A slave's floor per partition: the offset below which it never truncates (issue 12.2).

A master acknowledges ``acks=all`` once every live slave *reported* (in a replica fetch) a log end
past the batch. So every offset a slave reported in a request its master answered (authenticated)
may have been acknowledged to a producer: it is the floor. Following a master whose log is shorter
than the floor would delete acknowledged records; the slave refuses instead (replication.py parks
the partition and reports it). The floor is kept in ``<data_dir>/replica_floor.json``, written at
most every :data:`SAVE_INTERVAL_S` and at stop. It only protects more than acks=all does (acks=master
records that were reported count too), never less, except for the last interval before a crash.

It also remembers whether the partition's log has taken its master's incarnation history once
(``synced``): from then on a master history that shares no incarnation with ours means a log with
other records (a replaced disk), not a pair that has not met yet, so offsets alone no longer decide.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import structlog

from mqd.fsutil import atomic_write

log = structlog.get_logger(__name__)

FLOOR_FILE = "replica_floor.json"
SAVE_INTERVAL_S = 1.0


class ReplicaFloor:
    """Per partition, the highest log end this slave reported to a master that answered."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / FLOOR_FILE
        self._floors: dict[tuple[str, int], int] = {}
        self._synced: set[tuple[str, int]] = set()
        self._dirty = False
        self._saved_at = 0.0

    def load(self) -> None:
        try:
            raw = json.loads(self._path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # refusing to start would leave the partition unserved; a missing floor only weakens
            # the guard, so say so loudly
            log.error("replica floor unreadable: starting without it", path=str(self._path), error=str(exc))
            return
        for entry in raw.get("partitions", []) if isinstance(raw, dict) else []:
            try:
                key = (str(entry["topic"]), int(entry["partition"]))
                self._floors[key] = int(entry["floor"])
                if entry.get("synced") is True:
                    self._synced.add(key)
            except (KeyError, TypeError, ValueError):
                log.error("malformed replica floor entry ignored", path=str(self._path), entry=entry)

    def floor(self, topic: str, partition: int) -> int:
        return self._floors.get((topic, partition), 0)

    def raise_to(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        if offset > self._floors.get(key, 0):
            self._floors[key] = offset
            self._dirty = True

    def synced(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._synced

    def mark_synced(self, topic: str, partition: int) -> None:
        if (topic, partition) not in self._synced:
            self._synced.add((topic, partition))
            self._dirty = True

    def reset(self, topic: str, partition: int, offset: int) -> None:
        """The log restarted at ``offset`` (the master's retention passed it): the floor follows."""
        self._floors[(topic, partition)] = offset
        self._dirty = True

    def save(self, *, force: bool = False) -> None:
        """Persist when changed, at most every SAVE_INTERVAL_S unless ``force``."""
        now = time.monotonic()
        if not self._dirty or (not force and now - self._saved_at < SAVE_INTERVAL_S):
            return
        keys = sorted(set(self._floors) | self._synced)
        entries = [
            {
                "topic": t,
                "partition": p,
                "floor": self._floors.get((t, p), 0),
                "synced": (t, p) in self._synced,
            }
            for t, p in keys
        ]
        atomic_write(self._path, json.dumps({"partitions": entries}).encode())
        self._dirty = False
        self._saved_at = now
