"""Deliberate position changes: ``mqd offsets reset`` and ``mqd offsets show`` (issue 17).

The landing, not the broker commit, is the source of truth of where a partition resumes (a
partition with landed files resumes after its landed head;
docs/decisions/034-config-users-know-deliberate-replays.md). So moving a
Kafka-style committed offset (``kafka-consumer-groups --reset-offsets``) does nothing by itself;
the daemon warns about it at start. A reset is instead recorded in the landing, beside its state,
as one *reset record* per partition (``_resets/<topic>/<partition:05d>.json``): the new position and
the landed head it was decided against. The daemon's start-position hook (mqd/daemon.py) applies a
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

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
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
    from mqd.landing.store import LandingStore
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


# -- planning (pure) -----------------------------------------------------------------------------


TargetKind = Literal["earliest", "latest", "offset", "timestamp"]


@dataclass(frozen=True, slots=True)
class Target:
    kind: TargetKind
    value: int | None = None  # offset, or ms since the epoch


def parse_target(text: str) -> Target:
    """``earliest`` | ``latest`` | an offset | an ISO 8601 datetime (no zone: UTC)."""
    t = text.strip()
    low = t.lower()
    if low in ("earliest", "first"):
        return Target("earliest")
    if low in ("latest", "last"):
        return Target("latest")
    if re.fullmatch(r"[0-9]+", t):
        return Target("offset", int(t))
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ResetError(
            f"--to {text!r}: use earliest, latest, an offset (e.g. 1500) or an ISO datetime "
            "(e.g. 2026-11-24T09:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return Target("timestamp", int(when.timestamp() * 1000))


def parse_partitions(specs: Iterable[str], partitions_of: dict[str, int]) -> list[TopicPartition]:
    """``topic`` (every partition) or ``topic:partition`` specs, checked against the metadata."""
    out: set[TopicPartition] = set()
    for spec in specs:
        topic, sep, part = spec.rpartition(":") if ":" in spec else (spec, "", "")
        try:
            check_topic_name(topic)
        except ValueError as exc:
            raise ResetError(f"{spec!r}: {exc}") from None
        if topic not in partitions_of:
            raise ResetError(f"{spec!r}: topic {topic!r} is not in the cluster metadata")
        count = partitions_of[topic]
        if not sep:
            out.update(TopicPartition(topic, p) for p in range(count))
            continue
        if not part.isdigit() or int(part) >= count:
            raise ResetError(f"{spec!r}: topic {topic!r} has partitions 0..{count - 1}")
        out.add(TopicPartition(topic, int(part)))
    return sorted(out)


@dataclass(frozen=True, slots=True)
class PlanRow:
    """One partition of ``mqd offsets reset`` (or ``show``, without a new position)."""

    tp: TopicPartition
    landed_next: int | None  # the landing's resume position (None: nothing landed)
    committed: int | None  # the broker's committed offset (None: none, or not reachable)
    log_start: int | None
    log_end: int | None
    pending: int | None  # a reset record not yet applied
    new: int | None = None
    action: str = ""  # move | unchanged | refused
    note: str = ""


def plan_row(
    tp: TopicPartition,
    *,
    landed_next: int | None,
    committed: int | None,
    log_start: int,
    log_end: int,
    pending: int | None,
    target: int,
    landed_incarnation: str | None = None,
    replaying: bool = False,
) -> PlanRow:
    """The decision for one partition: ``target`` clamped to the log (as Kafka's tool does);
    below the landed head a replay (refused while the landed incarnation is unknown or another
    replay is still landing); else a move, with what it skips."""
    new, note = target, ""
    if new < log_start:
        new, note = log_start, f"{target} is below the log start: {log_start}"
    elif new > log_end:
        new, note = log_end, f"{target} is past the log end: {log_end}"
    row = PlanRow(tp, landed_next, committed, log_start, log_end, pending, new)
    current = pending if pending is not None else landed_next
    if replaying:
        return _with(row, "refused", "a replay of this partition is still landing: start the daemon first")
    if landed_next is not None and new < landed_next:
        if landed_incarnation is None:
            return _with(
                row,
                "refused",
                f"offsets {new}..{landed_next - 1} are landed and their log incarnation is unknown "
                "(format-1 files, or a Kafka broker without topic ids): "
                "a replay cannot be told apart from them",
            )
        again = f"replays {landed_next - new} offsets ({new}..{landed_next - 1}): they land once more"
        return _with(row, "replay", f"{note}; {again}" if note else again)
    if current is not None and new == current:
        return _with(row, "unchanged", note)
    if landed_next is not None and new > landed_next:
        skip = f"skips {new - landed_next} offsets ({landed_next}..{new - 1})"
        return _with(row, "move", f"{note}; {skip}" if note else skip)
    return _with(row, "move", note)


def _with(row: PlanRow, action: str, note: str) -> PlanRow:
    return PlanRow(
        row.tp, row.landed_next, row.committed, row.log_start, row.log_end, row.pending, row.new, action, note
    )


def table(rows: list[PlanRow], *, with_new: bool) -> str:
    """Rows as an aligned text table ("-" for unknown)."""

    def cell(v: int | None) -> str:
        return "-" if v is None else str(v)

    head = ["PARTITION", "LANDED", "COMMITTED", "LOG-START", "LOG-END", "PENDING"]
    if with_new:
        head += ["NEW", "ACTION", "NOTE"]
    lines = [head]
    for r in rows:
        line = [
            f"{r.tp.topic}:{r.tp.partition}",
            cell(r.landed_next),
            cell(r.committed),
            cell(r.log_start),
            cell(r.log_end),
            cell(r.pending),
        ]
        if with_new:
            line += [cell(r.new), r.action, r.note]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- the tool (queue lookups through the engine's source seam) -------------------------------------


class OffsetsTool:
    """Reads what ``show`` and ``reset`` need: metadata, committed offsets and log bounds from the
    queue (whatever ``consumer.source``), landed heads from the landing. Build, ``start()``, use,
    ``stop()``."""

    def __init__(self, config: Any) -> None:
        from mqd.consumer.consumer import group_settings
        from mqd.consumer.offset_store import LocalFileOffsetStore, OffsetStore
        from mqd.sources import open_source

        self._config = config
        cc = config.consumer
        self._source = open_source(cc)
        self._offsets: OffsetStore
        if cc.mode == "cluster":
            self._offsets = self._source.consumer_group(group_settings(cc), lambda: None).offsets
        else:
            self._offsets = LocalFileOffsetStore(cc.offset_file)
        self._store: LandingStore | None = None

    async def start(self) -> None:
        from mqd.landing.backends import open_store

        cc = self._config.consumer
        await self._source.start(timeout=cc.request_timeout)
        await self._offsets.start()
        lc = self._config.landing
        self._store = open_store(lc.dir, endpoint_url=lc.s3.endpoint_url, region=lc.s3.region)

    @property
    def store(self) -> LandingStore:
        """The landing's store (landed heads), after ``start()``."""
        if self._store is None:
            raise RuntimeError("OffsetsTool.start() was not called")
        return self._store

    @property
    def landing(self) -> Objects:
        """The landing's objects (where reset records are kept), after ``start()``."""
        return self.store.objects

    async def stop(self) -> None:
        await self._offsets.stop()
        await self._source.stop()

    def partitions_of(self) -> dict[str, int]:
        cluster = self._source.cluster
        return {} if cluster is None else {t: len(tps) for t, tps in cluster.topics.items()}

    async def _lookup(
        self, tps: list[TopicPartition], spec: str, ts: int | None = None
    ) -> dict[TopicPartition, int]:
        cluster = self._source.cluster
        by_node: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            nodes = [] if cluster is None else cluster.candidates(tp)
            if not nodes:
                raise ResetError(f"{tp}: no node serves this partition (metadata)")
            by_node.setdefault(nodes[0], []).append(tp)
        out: dict[TopicPartition, int] = {}
        for node, group in by_node.items():
            out.update(await self._source.list_offsets(node, group, spec, ts))
        return out

    async def rows(self, tps: list[TopicPartition]) -> list[PlanRow]:
        """Each partition's landed head, committed offset, log bounds and pending reset."""
        from mqd.consumer.errors import ConsumerError

        loop = asyncio.get_running_loop()
        try:
            committed = await self._offsets.load(tps)
        except ConsumerError:
            committed = {}  # shown as "-": the landing decides anyway
        starts = await self._lookup(tps, "earliest")
        ends = await self._lookup(tps, "latest")
        out = []
        for tp in tps:
            head = await loop.run_in_executor(None, self.store.head, tp.topic, tp.partition)
            rec = await loop.run_in_executor(None, read_reset, self.landing, tp)
            landed = None if head.last_offset is None else head.last_offset + 1
            pending = None
            if rec is not None and apply_reset(rec, landed, head.incarnation) is not None:
                pending = rec.to_offset
            out.append(PlanRow(tp, landed, committed.get(tp), starts.get(tp), ends.get(tp), pending))
        return out

    async def heads(
        self, tps: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int | None, str | None, bool]]:
        """Per partition: the landed next offset, its incarnation, and whether a replay is still
        landing (its landed head carries the replay id)."""
        loop = asyncio.get_running_loop()
        out = {}
        for tp in tps:
            head = await loop.run_in_executor(None, self.store.head, tp.topic, tp.partition)
            landed = None if head.last_offset is None else head.last_offset + 1
            rec = await loop.run_in_executor(None, read_reset, self.landing, tp)
            replaying = rec is not None and resume(rec, landed, head.incarnation).outcome == "replaying"
            inc = rec.incarnation if replaying and rec is not None else head.incarnation
            out[tp] = (landed, inc, replaying)
        return out

    async def targets(self, tps: list[TopicPartition], target: Target) -> dict[TopicPartition, int]:
        if target.kind == "offset":
            assert target.value is not None
            return dict.fromkeys(tps, target.value)
        if target.kind == "timestamp":
            return await self._lookup(tps, "timestamp", target.value)
        return await self._lookup(tps, target.kind)
