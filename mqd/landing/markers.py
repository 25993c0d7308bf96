"""Completeness markers: ``topic=t/dt=D/hour=H/_COMPLETE`` once an hour of a topic is whole.

An hour is complete when every partition of the topic has a watermark at or past the hour's end.
A partition's watermark (in its state file) is the larger of the highest event time it published
and the wall-clock time at which its daemon saw it idle at the log end (minus a grace period for
records in flight). Any daemon may write markers: the marker is created exclusively (idempotent)
and the progress record is updated under a lock.

Event times come from producers, so the watermark trusts them only up to a bound: a published file
whose newest event time is more than ``landing.max_event_ahead`` past the wall clock that
published it (a producer's clock two days fast, a nanosecond stamp) lands like any other file but
does not move the watermark; its records are counted and logged (the rule: watermark.py). One
outlier would otherwise mark the current hour, and every hour up to the outlier, complete at once.
Markers are also never written for an hour that has not ended by the writer's wall clock, so hour
folders created before an outlier's hour are still marked when they become whole.

A record stamped into an hour after its marker exists still lands (in that hour's folder) but
arrives late. Markers are written only for hour folders that exist.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mqd import fsutil
from mqd.landing import layout
from mqd.landing.layout import LandingCorrupt
from mqd.landing.local_store import PartitionState

IDLE_GRACE_MS = 10_000  # an idle partition vouches for event times older than now - grace
MARKERS_LOCK_TIMEOUT_S = 1.0  # others hold the topic's marker lock for milliseconds, unless frozen


def _state_dir(root: Path, topic: str) -> Path:
    return root / layout.topic_state_dir(topic)


def read_watermarks(root: Path, topic: str, partitions: int) -> list[int | None]:
    """Watermark per partition 0..partitions-1 (None: unknown, nothing published or seen idle)."""
    out: list[int | None] = []
    for p in range(partitions):
        path = _state_dir(root, topic) / f"{p:05d}.json"
        try:
            st = PartitionState.from_json(json.loads(path.read_bytes()))
        except FileNotFoundError:
            out.append(None)
            continue
        except (ValueError, LandingCorrupt):
            out.append(None)
            continue
        out.append(st.watermark_ms)
    return out


def _hour_dirs(root: Path, topic: str, from_hour: int, to_hour: int) -> list[tuple[int, Path]]:
    """Existing ``hour=`` folders of the topic with from_hour <= hour < to_hour."""
    base = root / layout.topic_dir(topic)
    out: list[tuple[int, Path]] = []
    if not base.is_dir():
        return out
    first_day = from_hour // 24
    for day in sorted(base.glob("dt=*")):
        try:
            day_hour = layout.hour_of_dir(day.name[3:], "00")
        except ValueError:
            continue
        if day_hour // 24 < first_day or day_hour >= to_hour:
            continue
        for hdir in day.glob("hour=*"):
            try:
                h = layout.hour_of_dir(day.name[3:], hdir.name[5:])
            except ValueError:
                continue
            if from_hour <= h < to_hour:
                out.append((h, hdir))
    return sorted(out)


def update_markers(root: Path, topic: str, partitions: int, now_ms: int | None = None) -> list[Path]:
    """Write the markers of every hour that became complete; returns the markers created.
    ``now_ms``: the wall clock (default: now); an hour that has not ended by it is never marked.
    fsutil.LockTimeout (retriable) when another process holds the topic's marker lock past
    :data:`MARKERS_LOCK_TIMEOUT_S` (the next call tries again)."""
    root = Path(root)
    marks = read_watermarks(root, topic, partitions)
    if not marks or any(m is None for m in marks):
        return []
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    # hours < this are whole; capped by the clock: a watermark already pushed ahead (by a landing
    # written before the bound, or a clock that jumped) must not mark, nor skip, hours to come
    done_before = min(min(m for m in marks if m is not None), now_ms) // layout.HOUR_MS
    progress = _state_dir(root, topic) / "_markers.json"
    created: list[Path] = []
    # bounded: a daemon frozen while it holds this lock must not stall the caller's landing loop
    with fsutil.locked(_state_dir(root, topic) / "_markers.lock", timeout=MARKERS_LOCK_TIMEOUT_S):
        try:
            start = int(json.loads(progress.read_bytes())["complete_before_hour"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            start = 0
        if done_before < start:
            # the progress ran ahead of what the watermarks vouch for now (moved by an outlier
            # before the bound existed, or by a clock that jumped): step it back, so the hours in
            # between are marked when they become whole; markers already written stay
            layout.write_atomic(progress, json.dumps({"complete_before_hour": done_before}).encode())
            return []
        if done_before == start:
            return []
        for h, hdir in _hour_dirs(root, topic, start, done_before):
            marker = hdir / layout.MARKER_NAME
            body = {
                "topic": topic,
                "dt": hdir.parent.name[3:],
                "hour": hdir.name[5:],
                "partitions": partitions,
                "hour_start_ms": h * layout.HOUR_MS,
                "watermark_ms": min(m for m in marks if m is not None),
                "created": layout.iso_now(),
            }
            if marker.exists():
                continue
            # the one atomic write to a private name, then an exclusive link: never a half-written
            # marker, and never one replacing a marker another daemon wrote
            tmp = hdir / f".{layout.MARKER_NAME}.{os.getpid()}.tmp"
            layout.write_atomic(tmp, json.dumps(body).encode() + b"\n")
            try:
                os.link(tmp, marker)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
            layout.fsync_dir(hdir)
            created.append(marker)
        layout.write_atomic(progress, json.dumps({"complete_before_hour": done_before}).encode())
    return created
