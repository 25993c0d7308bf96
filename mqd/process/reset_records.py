"""The reset records of deliberate position changes (issue 17): written by ``mqd offsets reset``
(mqd/operator/offsets_command.py), applied by the daemon's start-position hook (mqd/process/daemon.py).

The landing, not the broker commit, is the source of truth of where a partition resumes (a
partition with landed files resumes after its landed head;
docs/decisions/034-config-users-know-deliberate-replays.md). So moving a
Kafka-style committed offset (``kafka-consumer-groups --reset-offsets``) does nothing by itself;
the daemon warns about it at start. A reset is instead recorded in the landing, beside its state,
as one *reset record* per partition (``_resets/<topic>/<partition:05d>.json``): the new position and
the landed head it was decided against. The daemon's start-position hook (mqd/process/daemon.py) applies a
record only while the landed head is still that one, so

- a record survives restarts until the partition publishes past it (a crash before the first
  publication applies it again: it is not silently undone);
- a record made stale by a publication of another group member is not applied (logged), so it can
  never move a partition backwards over landed records: no duplicates;
- a forward reset logs and counts the skipped offsets when it is applied.

**A reset below the landed head is a deliberate replay.** The landing names a file by (partition,
incarnation, first offset) and refuses a range at or below its landed end *of the same
incarnation*, and Spark's file source remembers paths: landed again under their own incarnation,
the records would collide with the files already there. So a replay gets a *replay id* (a fresh
incarnation-shaped id) recorded with the reset: the daemon lands the replayed range X..L (L: the
landed end when the reset was made) tagged with the replay id instead of the log's incarnation,
and the records after L with the log's own again. The landing accepts the range as it accepts a
new incarnation's reused offsets (its existing rule), the files get new names, Spark reads them,
and each replayed record lands exactly once more; the table's ``incarnation`` column says which
rows are the replay. A restart in the middle resumes the replay (the landed head then carries the
replay id, which the start hook maps back to the log's incarnation: the broker never sees it).
The record is removed once the partition landed past L under the log's incarnation. A replay needs
the landed incarnation to be known (mqd brokers; the Kafka source's topic id and leader-epoch
lineage, sources/kafka/log_incarnation.py): otherwise (format-1 files, a Kafka broker without topic
ids) it is refused. A partition with nothing landed can be reset anywhere.

The daemon must be stopped (``mqd offsets reset`` refuses when it runs); other members of the
same group must be too, or they may land the partition in between (the record then goes stale).

Records are objects of the landing's store (objects.py: ``put``, ``get``, ``delete``), so a local
directory and an ``s3://`` landing share this one implementation: on a directory the record is the
file ``<landing>/_resets/<t>/<p>.json`` (written to a temp file, fsynced, renamed), on S3 the object
of that key. A record has one writer (the CLI, with the daemons stopped) and is removed by the
daemon's start hook only, so no condition is needed on it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mqd.errors import MqdError
from mqd.landing.objects import Objects
from mqd.lazy_import import lazy_import
from mqd.topic_name import check_topic_name
from mqd.topic_partition import TopicPartition

if TYPE_CHECKING:
    import numpy as np

    from mqd.consumer.process_queue import FetchedBatch
else:
    np = lazy_import("numpy")  # only a replay needs it, never the start path (mqd/lazy_import.py)

RESET_DIR = "_resets"  # "_": Spark's file source and the landing's readers skip it
_VERSION = 1


class ResetError(MqdError):
    """A reset that cannot be made as asked (bad target, replay, unreadable record). Not retriable."""

    retriable = False


# -- the reset record (read by the daemon at start) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResetRecord:
    """Where a partition resumes, decided while its landed head was ``landed_next``."""

    tp: TopicPartition
    to_offset: int
    landed_next: int | None  # the landed head's next offset when the reset was made (None: nothing)
    incarnation: str | None  # of the landed head (the new position continues that log)
    created: str
    replay_id: str | None = None  # a reset below the landed head: the replayed range's id
    replay_end: int | None = None  # the last offset replayed (the landed end when it was made)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": _VERSION,
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "to_offset": self.to_offset,
            "landed_next": self.landed_next,
            "incarnation": self.incarnation,
            "created": self.created,
            "replay_id": self.replay_id,
            "replay_end": self.replay_end,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ResetRecord:
        if d.get("version") != _VERSION:
            raise ValueError(f"unknown reset record version {d.get('version')!r}")
        landed = d.get("landed_next")
        inc = d.get("incarnation")
        return cls(
            tp=TopicPartition(str(d["topic"]), int(d["partition"])),
            to_offset=int(d["to_offset"]),
            landed_next=None if landed is None else int(landed),
            incarnation=None if inc is None else str(inc),
            created=str(d.get("created", "")),
            replay_id=None if d.get("replay_id") is None else str(d["replay_id"]),
            replay_end=None if d.get("replay_end") is None else int(d["replay_end"]),
        )


Landing = Objects | Path  # the landing's objects, or a local landing's root


def reset_key(tp: TopicPartition) -> str:
    """The record's key under the landing root."""
    return f"{RESET_DIR}/{check_topic_name(tp.topic)}/{tp.partition:05d}.json"


def reset_path(landing: Path, tp: TopicPartition) -> Path:
    """The record's file in the local landing ``landing``."""
    return landing / reset_key(tp)


def _objects(landing: Landing) -> Objects:
    if isinstance(landing, Path):
        from mqd.landing.local_objects import LocalObjects

        return LocalObjects(landing)
    return landing


def read_reset(landing: Landing, tp: TopicPartition) -> ResetRecord | None:
    """The partition's reset record, or None. A record that cannot be read raises ResetError
    naming it (it must not be ignored: it was written deliberately)."""
    objects = _objects(landing)
    where = f"{objects.location}/{reset_key(tp)}"
    got = objects.get(reset_key(tp))
    if got is None:
        return None
    try:
        rec = ResetRecord.from_json(json.loads(got[0]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ResetError(
            f"{where}: unreadable offsets reset record ({exc}); delete it or reset again"
        ) from None
    if rec.tp != tp:
        raise ResetError(f"{where}: the record is for {rec.tp}, not {tp}")
    return rec


def write_reset(landing: Landing, rec: ResetRecord) -> None:
    """Write (or replace) the record; durable when it returns (objects.py)."""
    _objects(landing).put(reset_key(rec.tp), json.dumps(rec.to_json()).encode())


def clear_reset(landing: Landing, tp: TopicPartition) -> None:
    _objects(landing).delete(reset_key(tp))


@dataclass(frozen=True, slots=True)
class Replay:
    """A replay in progress: records of ``incarnation`` up to ``end`` land as ``replay_id``."""

    replay_id: str
    incarnation: str
    end: int


Outcome = Literal["applied", "replaying", "cleared"]


@dataclass(frozen=True, slots=True)
class Resume:
    """What the start hook does with a record, given the landed head."""

    outcome: Outcome  # applied: starts now; replaying: a replay resumes; cleared: nothing to do
    position: int | None  # where the partition resumes
    incarnation: str | None  # the log's (never a replay id: the broker must not see one)
    replay: Replay | None = None  # records to tag while they land
    skipped: int = 0  # a forward reset: offsets between the landed head and the new position
    replayed: int = 0  # a replay: offsets landed again


def resume(rec: ResetRecord, landed_next: int | None, landed_inc: str | None) -> Resume:
    """Where a partition with reset record ``rec`` resumes, from its landed head (``landed_next``,
    of incarnation ``landed_inc``). A record made stale by later landings is ``cleared`` (applying
    it could move the partition back over records landed since)."""
    replay = None
    if rec.replay_id is not None and rec.incarnation is not None and rec.replay_end is not None:
        replay = Replay(rec.replay_id, rec.incarnation, rec.replay_end)
    if replay is not None and landed_inc == replay.replay_id:
        return Resume("replaying", landed_next, replay.incarnation, replay)
    if landed_next == rec.landed_next and (landed_next is None or landed_inc == rec.incarnation):
        skipped = 0 if landed_next is None else max(0, rec.to_offset - landed_next)
        replayed = 0 if replay is None else replay.end + 1 - rec.to_offset
        inc = rec.incarnation if landed_next is not None else None
        return Resume("applied", rec.to_offset, inc, replay, skipped, replayed)
    return Resume("cleared", landed_next, landed_inc)


def apply_reset(rec: ResetRecord, landed_next: int | None, landed_inc: str | None = None) -> Resume | None:
    """``resume`` for a record still to be applied, else None (in progress or cleared)."""
    inc = rec.incarnation if landed_inc is None and landed_next is not None else landed_inc
    r = resume(rec, landed_next, inc)
    return r if r.outcome == "applied" else None


def retag(batch: FetchedBatch, replay: Replay) -> list[FetchedBatch]:
    """``batch`` with its records of the replayed range tagged with the replay id (split in two
    when it spans the range's end). One slice per batch, never an object per record."""
    if batch.incarnation != replay.incarnation or batch.first_offset > replay.end:
        return [batch]
    if batch.next_offset - 1 <= replay.end:
        return [dataclasses.replace(batch, incarnation=replay.replay_id)]
    rb = batch.records
    offsets = rb.column(0).to_numpy()
    k = int(np.searchsorted(offsets, replay.end, side="right"))
    if k == 0:
        return [batch]
    head, tail = rb.slice(0, k), rb.slice(k)
    return [
        dataclasses.replace(
            batch,
            records=head,
            next_offset=int(offsets[k - 1]) + 1,
            nbytes=head.nbytes,
            incarnation=replay.replay_id,
        ),
        dataclasses.replace(batch, records=tail, first_offset=int(offsets[k]), nbytes=tail.nbytes),
    ]
