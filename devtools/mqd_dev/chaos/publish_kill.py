"""``kill_before_publish``: a fresh daemon killed as soon as it has fetched, before it publishes.

The daemon is killed and started again (a fresh process: nothing in memory); its log is watched
from that start for the ``start positions`` line with a non-empty assignment (positions resolved,
fetching begins), then it is given a moment to fetch, shorter than the landing's ``max_age``, and
killed with SIGKILL. Whether it published in between is read from the landing state (the last
published offset of each partition it was given did not move) and noted with the round. What this
probes: a position resolved for a new owner (from the landing, a commit or ``consume_from``) must be
durable, or the restart resolves another one and what arrived in between never lands.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mqd_dev.chaos.procs import DaemonProc


def _position_lines(log_path: Path, start: int) -> Iterator[list[int]]:
    """The partitions of every ``start positions`` line with a non-empty assignment after byte
    ``start`` of the daemon's JSON log, in log order."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(start)
            text = fh.read().decode(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if '"start positions"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        positions = rec.get("positions") if isinstance(rec, dict) else None
        if isinstance(positions, dict) and positions:
            # keys are str(TopicPartition): "<topic>/<partition>"
            yield sorted(int(str(k).rsplit("/", 1)[1]) for k in positions)


def assigned_partitions(log_path: Path, start: int) -> list[int] | None:
    """Partitions of the first ``start positions`` line with a non-empty assignment after byte
    ``start`` of the daemon's JSON log; None until there is one."""
    return next(_position_lines(log_path, start), None)


def resolved_partitions(log_path: Path, start: int) -> set[int]:
    """Every partition the daemon resolved a start position for after byte ``start``: one
    assignment may be resolved in several ``start positions`` lines (a partition whose position
    was already known comes first, alone), so the first line alone may not be the whole of it."""
    return {p for parts in _position_lines(log_path, start) for p in parts}


async def kill_before_publish(
    d: DaemonProc, landed_end: Callable[[], dict[int, int]], *, fetch_s: float, timeout: float
) -> str:
    """Kill ``d``, start it, kill it again right after its first assignment; returns a note. The
    caller restarts it after the hold."""
    await d.stop_async(signal.SIGKILL)
    start = d.log_path.stat().st_size if d.log_path.exists() else 0
    d.start()
    deadline = time.monotonic() + timeout
    parts: list[int] | None = None
    while parts is None and time.monotonic() < deadline and d.running:
        await asyncio.sleep(0.02)
        parts = assigned_partitions(d.log_path, start)
    before = landed_end()
    if parts is not None:
        await asyncio.sleep(fetch_s)
    after = landed_end()
    await d.stop_async(signal.SIGKILL)
    if parts is None:
        return f"kill_before_publish {d.name}: no assignment within {timeout}s, killed anyway"
    published = [p for p in parts if after.get(p) != before.get(p)]
    state = f"published {published} first" if published else "before any publication"
    return f"kill_before_publish {d.name}: killed {fetch_s}s after assignment of {parts}, {state}"
