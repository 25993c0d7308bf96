"""The views of a daemon's status: pure functions of the ``/status`` JSON the admin endpoint serves.

:func:`partition_rows` parses that JSON once into :class:`PartitionRow` s, and ``mqd status``
(:func:`render_summary`), ``mqd top`` (mqd/operator/top.py) and the HTML status page
(mqd/operator/status_page.py) draw from them, so all three show exactly what the endpoint serves;
:func:`duration` and :func:`binary_size` are the one format of a time and a size in every view.
Here, rather than in the endpoint's module, so the status page and the endpoint that serves it do
not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    position: int | None
    committed: int | None
    log_end: int | None
    lag: int | None
    node: str
    flow: str
    paused: bool
    parked: bool
    error: str
    landed: int | None = None
    time_lag_s: float | None = None  # the age of the oldest record not landed yet (0: caught up)
    fetch_lag: int | None = None  # the log end minus the fetch position: records not fetched yet
    stuck: bool = False
    error_age_s: float | None = None  # since ``error`` was last set
    leader: str = ""  # by the metadata; ``node`` (where it is read) may be a replica

    @property
    def node_text(self) -> str:
        """Where the partition is read, and its leader when a replica serves it."""
        if self.leader and self.node and self.leader != self.node:
            return f"{self.node} (leader {self.leader})"
        return self.node or self.leader

    @property
    def state(self) -> str:
        """What holds the partition back, if anything: parked (offset policy), paused, flow control."""
        return "parked" if self.parked else "paused" if self.paused else self.flow


def _section(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _float_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def partition_rows(status: Mapping[str, Any]) -> list[PartitionRow]:
    """Per-partition rows from the status JSON: the consumer's ``assignment`` mapping, with the
    keys mqd.consumer.snapshot.consumer_status_json writes (one shape: no aliases to guess)."""
    assignment = _section(_section(status, "consumer"), "assignment")
    rows = []
    for e in assignment.values():
        if not isinstance(e, Mapping):
            continue
        topic, part = e.get("topic"), e.get("partition")
        if not isinstance(topic, str) or not isinstance(part, int):
            continue
        rows.append(
            PartitionRow(
                topic=topic,
                partition=part,
                position=_int_or_none(e.get("position")),
                committed=_int_or_none(e.get("committed")),
                log_end=_int_or_none(e.get("log_end")),
                lag=_int_or_none(e.get("lag")),
                node=str(e.get("pull_node") or ""),
                flow=str(e.get("flow_control") or ""),
                paused=bool(e.get("paused")),
                parked=bool(e.get("parked")),
                error=str(e.get("last_error") or ""),
                landed=_int_or_none(e.get("landed")),
                time_lag_s=_float_or_none(e.get("time_lag_s")),
                fetch_lag=_int_or_none(e.get("fetch_lag")),
                stuck=e.get("stuck") is True,
                error_age_s=_float_or_none(e.get("last_error_age_s")),
                leader=str(e.get("leader") or ""),
            )
        )
    rows.sort(key=lambda r: (r.topic, r.partition))
    return rows


def duration(seconds: float | None) -> str:
    """``4.2s``, ``12s``, ``3m04s``, ``2h05m``, ``3d04h``; ``-`` when unknown (every view's format)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def binary_size(n: float | None) -> str:
    """Bytes in binary units (``84.2MiB``); ``-`` when unknown."""
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}B"


def _published(status: Mapping[str, Any]) -> str:
    stats = status.get("stats")
    if not isinstance(stats, Mapping):
        return ""
    recs = stats.get("records_published")
    files = stats.get("files_published")
    out = ""
    if isinstance(recs, int):
        out += f", {recs} records landed"  # exact, as the offsets are
    if isinstance(files, int):
        out += f" in {files} files"
    return out


def render_summary(status: Mapping[str, Any]) -> str:
    """The human summary of ``mqd status``."""
    health = _section(status, "health")
    runner = _section(status, "runner")
    consumer = _section(status, "consumer")
    rows = partition_rows(status)
    lines = [
        f"mqd is {status.get('state', 'running')}: {health.get('status', 'unknown')}"
        + (
            f" (pid {runner.get('pid')}, up {duration(_float_or_none(runner.get('uptime_s')))})"
            if runner
            else ""
        ),
    ]
    for reason in health.get("reasons") or []:
        lines.append(f"  ! {reason}")
    unmatched = _section(status, "subscription").get("unmatched_patterns") or []
    if unmatched:
        lines.append(f"  ! topic patterns match no topic yet: {', '.join(map(str, unmatched))}")
    if consumer:
        member = consumer.get("member_id") or "?"
        gen = consumer.get("generation", "?")
        lines.append(f"  group {consumer.get('group', '?')}, member {member}, member version {gen}")
    lag = sum(r.lag or 0 for r in rows)
    paused = sum(1 for r in rows if r.paused)
    errors = [r for r in rows if r.error]
    lines.append(
        f"  {len(rows)} partitions assigned, {paused} paused, total lag {lag} records not landed"
        + _published(status)
    )
    totals = _section(consumer, "totals")
    if totals.get("incarnation_changes") or totals.get("lost_offsets"):
        lines.append(
            f"  ! log incarnation changed {totals.get('incarnation_changes', 0)} times "
            f"({totals.get('reused_offsets', 0)} reused offsets landed as new records), "
            f"{totals.get('lost_offsets', 0)} offsets lost by the broker"
        )
    stuck = [r for r in rows if r.stuck]
    if stuck:
        names = ", ".join(f"{r.topic}/{r.partition}" for r in stuck)
        lines.append(f"  ! {len(stuck)} partitions stuck (nothing landed while the log end grew): {names}")
    if rows:
        lines.append(_offsets_table(rows))
    for r in errors[:10]:
        age = "" if r.error_age_s is None else f" ({duration(r.error_age_s)} ago)"
        lines.append(f"  {r.topic}:{r.partition}: {r.error}{age}")
    if len(errors) > 10:
        lines.append(f"  ... and {len(errors) - 10} more partitions with errors (mqd status --json)")
    reload = _section(runner, "reload")
    if reload.get("count"):
        lines.append(f"  last reload: {'ok' if reload.get('ok') else 'refused: ' + str(reload.get('error'))}")
    return "\n".join(lines)


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


def _offsets_table(rows: list[PartitionRow]) -> str:
    """Exact offsets per partition: committed, landed, log end, lag (log end minus landed) and the
    time lag (the age of the oldest record not landed yet)."""
    header = ("TOPIC", "PART", "COMMITTED", "LANDED", "LOG-END", "LAG", "TIME-LAG", "STATE")
    table = [header]
    for r in rows:
        state = "stuck" if r.stuck else (r.state or "-")
        time_lag = None if r.time_lag_s is None else duration(r.time_lag_s)
        table.append(
            (
                r.topic,
                str(r.partition),
                _cell(r.committed),
                _cell(r.landed),
                _cell(r.log_end),
                _cell(r.lag),
                _cell(time_lag),
                state,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    out = []
    for row in table:
        cells = [
            c.ljust(w) if i in (0, 7) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  " + "  ".join(cells).rstrip())
    return "\n".join(out)
