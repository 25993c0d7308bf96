"""Deliberate position changes: ``mqd offsets reset`` and ``mqd offsets show`` (issue 17).

The landing, not the broker commit, is the source of truth of where a partition resumes, so a reset
is recorded in the landing as a reset record per partition (mqd/process/reset_records.py, where the rules
of applying one and of a deliberate replay are written down), which the daemon applies at start.
This module is the command's side: the target and partition specs, the plan per partition
(:func:`plan_row`: clamped to the log, a replay below the landed head, refused while one is still
landing), its table, and :class:`OffsetsTool`, which reads metadata, committed offsets and log
bounds through the engine's source seam and landed heads from the landing.

The daemon must be stopped (``mqd offsets reset`` refuses when it runs); other members of the
same group must be too, or they may land the partition in between (the record then goes stale).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from mqd.landing.objects import Objects
from mqd.process.reset_records import ResetError, apply_reset, read_reset, resume
from mqd.topic_name import check_topic_name
from mqd.topic_partition import TopicPartition

if TYPE_CHECKING:
    from mqd.landing.store import LandingStore


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
