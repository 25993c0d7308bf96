"""Completeness markers: ``topic=t/dt=D/hour=H/_COMPLETE`` once an hour of a topic is whole.

An hour is complete when every partition of the topic has a watermark at or past the hour's end.
A partition's watermark (in its state file) is the larger of the highest event time it published
and the wall-clock time at which its daemon saw it idle at the log end (minus a grace period for
records in flight). Any daemon may write markers: the marker is created only if absent (idempotent)
and the progress record (``_state/<t>/_markers.json``) is swapped by etag (``If-Match``), the same
on a local directory and on object storage (objects.py).

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
import time
from typing import Any

from mqd.landing import layout
from mqd.landing.errors import PreconditionFailed
from mqd.landing.objects import Objects

IDLE_GRACE_MS = 10_000  # an idle partition vouches for event times older than now - grace


def _hour_dirs(objects: Objects, topic: str, from_hour: int, to_hour: int) -> list[tuple[int, str]]:
    """Existing ``hour=`` folders (keys ending with '/') of the topic, from_hour <= hour < to_hour."""
    out: list[tuple[int, str]] = []
    first_day = from_hour // 24
    for day in objects.list_dirs(f"{layout.topic_dir(topic)}/"):
        dt = day.rstrip("/").rsplit("/", 1)[-1]
        if not dt.startswith("dt="):
            continue
        try:
            day_hour = layout.hour_of_dir(dt[3:], "00")
        except ValueError:
            continue
        if day_hour // 24 < first_day or day_hour >= to_hour:
            continue
        for hdir in objects.list_dirs(day):
            hh = hdir.rstrip("/").rsplit("/", 1)[-1]
            if not hh.startswith("hour="):
                continue
            try:
                h = layout.hour_of_dir(dt[3:], hh[5:])
            except ValueError:
                continue
            if from_hour <= h < to_hour:
                out.append((h, hdir))
    return sorted(out)


def _put_progress(objects: Objects, key: str, hour: int, etag: str | None) -> None:
    """Swap the progress record; a lost race leaves the other writer's value (read next round)."""
    body = json.dumps({"complete_before_hour": hour}).encode()
    try:
        if etag is None:
            objects.put(key, body, if_absent=True)
        else:
            objects.put(key, body, if_match=etag)
    except PreconditionFailed:
        pass


def mark_complete_hours(
    objects: Objects, topic: str, partitions: int, marks: list[int | None], now_ms: int | None = None
) -> list[str]:
    """Write the marker of every hour that became complete, given the partitions' watermarks
    ``marks``; returns the keys of the markers created. ``now_ms``: the wall clock (default:
    now); an hour that has not ended by it is never marked."""
    if not marks or any(m is None for m in marks):
        return []
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    low = min(m for m in marks if m is not None)
    # hours < this are whole; capped by the clock: a watermark already pushed ahead (by a landing
    # written before the bound, or a clock that jumped) must not mark, nor skip, hours to come
    done_before = min(low, now_ms) // layout.HOUR_MS
    progress = f"{layout.topic_state_dir(topic)}/_markers.json"
    got = objects.get(progress)
    try:
        start = int(json.loads(got[0])["complete_before_hour"]) if got else 0
    except (ValueError, KeyError, TypeError):
        start = 0
    etag = got[1] if got else None
    if done_before < start:
        # the progress ran ahead of what the watermarks vouch for now (moved by an outlier before
        # the bound existed, or by a clock that jumped): step it back, so the hours in between are
        # marked when they become whole; markers already written stay
        _put_progress(objects, progress, done_before, etag)
        return []
    if done_before == start:
        return []
    created: list[str] = []
    for h, hdir in _hour_dirs(objects, topic, start, done_before):
        body: dict[str, Any] = {
            "topic": topic,
            "dt": hdir.rstrip("/").split("/")[-2][3:],
            "hour": hdir.rstrip("/").split("/")[-1][5:],
            "partitions": partitions,
            "hour_start_ms": h * layout.HOUR_MS,
            "watermark_ms": low,
            "created": layout.iso_now(),
        }
        key = f"{hdir}{layout.MARKER_NAME}"
        try:  # never a half-written marker, never one replacing a marker another daemon wrote
            objects.put(key, json.dumps(body).encode() + b"\n", if_absent=True)
            created.append(key)
        except PreconditionFailed:
            pass
    _put_progress(objects, progress, done_before, etag)  # only forward from what we read
    return created
