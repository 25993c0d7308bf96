"""Completeness markers against producer clock outliers (issue 12, case 7), on a real landing."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from support.landing import read_watermarks, resume_position, update_markers

from mqd import metrics
from mqd.config import LandingConfig
from mqd.consumer import FetchedBatch, TopicPartition
from mqd.landing import LandingSink, LocalStore, Publisher, layout
from mqd.wire import format as fmt

HOUR = layout.HOUR_MS
DAY = 24 * HOUR


def records(first: int, ts: list[int]) -> pa.Table:
    raw = fmt.encode_batch(
        [b"v%d" % (first + i) for i in range(len(ts))], timestamps=np.array(ts), base_offset=first
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def markers_in(root: Path) -> set[str]:
    return {str(p.parent.relative_to(root)) for p in root.rglob(layout.MARKER_NAME)}


def test_one_record_stamped_days_ahead_marks_nothing(tmp_path: Path) -> None:
    """A record stamped two days ahead of the publishing clock lands (in its own hour folder) but
    does not move the partition's watermark: the current hour is not marked _COMPLETE, nor is the
    outlier's hour. Hours created afterwards, before the outlier's hour, are marked once the
    partition really passes them; a state rebuilt from the manifest reaches the same watermark."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    now = time.time_ns() // 1_000_000
    hour = now // HOUR
    start = hour * HOUR
    pub.publish("t", 0, records(0, [start, start + 1]), None)
    pub.publish("t", 0, records(2, [now + 2 * DAY]), 1)  # one producer's clock two days fast
    assert pub.store.head("t", 0).last_offset == 2  # the outlier landed
    assert read_watermarks(root, "t", 1) == [start + 1]
    assert update_markers(root, "t", 1) == []
    assert markers_in(root) == set()

    # the partition goes on in the next hour; its records are <= 1 h ahead, so they count
    pub.publish("t", 0, records(3, [(hour + 1) * HOUR]), 2)
    assert read_watermarks(root, "t", 1) == [(hour + 1) * HOUR]
    assert update_markers(root, "t", 1, now_ms=now) == []  # the current hour has not ended
    this_hour = layout.hour_dir("t", hour)
    next_hour = layout.hour_dir("t", hour + 1)
    assert update_markers(root, "t", 1, now_ms=(hour + 2) * HOUR) == [root / this_hour / layout.MARKER_NAME]
    pub.store.advance_watermark("t", 0, (hour + 2) * HOUR)  # seen idle after the next hour
    assert update_markers(root, "t", 1, now_ms=(hour + 2) * HOUR + 1) == [
        root / next_hour / layout.MARKER_NAME
    ]
    assert markers_in(root) == {this_hour, next_hour}

    # the state is rebuilt from the manifest: the outlier file still vouches for nothing
    state = root / layout.topic_state_dir("t") / "00000.json"
    state.unlink()
    assert pub.store.head("t", 0).watermark_ms == (hour + 1) * HOUR


def test_nanosecond_stamp_does_not_move_the_watermark(tmp_path: Path) -> None:
    """A producer stamping nanoseconds into the millisecond field (year ~50,000) lands, filed under
    the last folder hour, and leaves the watermark where the partition's real records put it."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    now = time.time_ns() // 1_000_000
    pub.publish("t", 0, records(0, [now - HOUR]), None)
    rng = pub.publish("t", 0, records(1, [time.time_ns()]), 0)
    assert rng.path.startswith("topic=t/dt=9999-12-31/hour=23/")
    assert read_watermarks(root, "t", 1) == [now - HOUR]


def test_marker_body_names_the_watermark(tmp_path: Path) -> None:
    """A marker written for an hour that has ended records the topic watermark that made it whole."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    t0 = (time.time_ns() // 1_000_000 // HOUR - 5) * HOUR  # five hours ago
    pub.publish("t", 0, records(0, [t0, t0 + HOUR]), None)
    pub.publish("t", 0, records(2, [t0 + HOUR]), 1)
    (marker,) = update_markers(root, "t", 1)
    assert json.loads(marker.read_bytes())["watermark_ms"] == t0 + HOUR


def test_progress_pushed_ahead_by_an_old_outlier_steps_back(tmp_path: Path) -> None:
    """A landing whose marker progress was pushed days ahead (by an outlier before the bound
    existed) gets the hours in between marked once they become whole, not skipped for ever."""
    root = tmp_path / "landing"
    pub = Publisher(LocalStore(root))
    pub.store.open()
    now = time.time_ns() // 1_000_000
    hour = now // HOUR - 3
    progress = root / layout.topic_state_dir("t") / "_markers.json"
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps({"complete_before_hour": hour + 48}))
    pub.publish("t", 0, records(0, [hour * HOUR, (hour + 1) * HOUR + 5]), None)
    pub.publish("t", 0, records(2, [(hour + 1) * HOUR + 5]), 1)
    assert update_markers(root, "t", 1) == []  # steps back to the hour the watermark vouches for
    pub.store.advance_watermark("t", 0, (hour + 2) * HOUR)
    assert update_markers(root, "t", 1) == [root / layout.hour_dir("t", hour + 1) / layout.MARKER_NAME]


async def test_sink_counts_records_stamped_past_its_configured_bound(tmp_path: Path) -> None:
    """Through the daemon's sink with landing.max_event_ahead = 60 s: a record stamped 2 hours
    ahead lands (a file of its own: another folder hour), is counted in
    mqd_event_time_ahead_records and leaves the watermark where the record before it put it."""
    sink = LandingSink(LandingConfig(dir=tmp_path / "landing", max_event_ahead=60.0))
    await sink.start()
    now = time.time_ns() // 1_000_000
    sample = ("mqd_event_time_ahead_records_total", {"topic": "ahead"})
    before = metrics.REGISTRY.get_sample_value(*sample) or 0.0
    ts = [now - HOUR, now + 2 * HOUR]
    raw = fmt.encode_batch([b"a", b"b"], timestamps=np.array(ts))
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    await resume_position(sink, TopicPartition("ahead", 0))
    sink.add(FetchedBatch(TopicPartition("ahead", 0), 1, rb, 0, 2, len(raw)))
    results = await sink.publish()
    await sink.close()
    assert [r.next_offset for r in results] == [2]
    assert [len(r.published) for r in results] == [2]
    assert metrics.REGISTRY.get_sample_value(*sample) == before + 1
    assert read_watermarks(tmp_path / "landing", "ahead", 1) == [ts[0]]
