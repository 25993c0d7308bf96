"""The pure parts of `mqd offsets reset` (mqd/operator/offsets_command.py, mqd/process/reset_records.py):
targets, partition specs, the per-partition decision, and when the daemon applies a recorded reset."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqd.operator.offsets_command import parse_partitions, parse_target, plan_row
from mqd.process.reset_records import (
    Replay,
    ResetError,
    ResetRecord,
    apply_reset,
    read_reset,
    reset_path,
    resume,
    retag,
    write_reset,
)
from mqd.topic_partition import TopicPartition

TP = TopicPartition("events", 0)


def test_targets() -> None:
    """earliest/latest (and mqd's first/last), offsets and ISO datetimes (UTC without a zone)."""
    assert parse_target("earliest").kind == "earliest" and parse_target("first").kind == "earliest"
    assert parse_target("latest").kind == "latest"
    assert parse_target("150").value == 150
    assert parse_target("1970-01-01T00:00:01Z").value == 1000
    assert parse_target("1970-01-01T00:00:01").value == 1000
    with pytest.raises(ResetError, match="earliest, latest, an offset"):
        parse_target("yesterday")


def test_partition_specs() -> None:
    """A topic means all its partitions; topic:partition one; unknown ones are refused."""
    known = {"events": 3}
    assert parse_partitions(["events"], known) == [TopicPartition("events", p) for p in range(3)]
    assert parse_partitions(["events:2", "events:2"], known) == [TopicPartition("events", 2)]
    for bad in ("clicks", "events:3", "events:x", "../x"):
        with pytest.raises(ResetError):
            parse_partitions([bad], known)


def _row(
    target: int, landed: int | None = 100, pending: int | None = None, inc: str | None = "a" * 32, **kw: bool
) -> tuple[str, int | None, str]:
    r = plan_row(
        TP,
        landed_next=landed,
        committed=90,
        log_start=10,
        log_end=500,
        pending=pending,
        target=target,
        landed_incarnation=inc,
        **kw,
    )
    return r.action, r.new, r.note


def test_plan_decisions() -> None:
    """Forward moves say what they skip; below the landed head is a replay (refused when the
    landed incarnation is unknown or a replay still lands); out-of-log targets are clamped (as
    Kafka's tool does); nothing landed may go anywhere."""
    assert _row(130) == ("move", 130, "skips 30 offsets (100..129)")
    assert _row(100) == ("unchanged", 100, "")
    assert _row(50) == ("replay", 50, "replays 50 offsets (50..99): they land once more")
    assert _row(50, inc=None)[0] == "refused"
    assert _row(130, replaying=True)[0] == "refused"
    assert _row(900) == ("move", 500, "900 is past the log end: 500; skips 400 offsets (100..499)")
    assert _row(0, landed=None) == ("move", 10, "0 is below the log start: 10")
    assert _row(130, pending=130)[0] == "unchanged"


def test_record_applies_only_against_the_head_it_was_made_for(tmp_path: Path) -> None:
    """A record survives until the partition lands past it; a stale one is never applied (it could
    move the partition back over landed records)."""
    rec = ResetRecord(TP, 130, 100, "a" * 32, "now")
    write_reset(tmp_path, rec)
    assert read_reset(tmp_path, TP) == rec
    applied = apply_reset(rec, 100)
    assert applied is not None and (applied.position, applied.skipped, applied.incarnation) == (
        130,
        30,
        "a" * 32,
    )
    assert apply_reset(rec, 140) is None
    assert resume(rec, 140, "a" * 32).outcome == "cleared"
    fresh = ResetRecord(TP, 0, None, None, "now")
    got = apply_reset(fresh, None)
    assert got is not None and (got.position, got.skipped) == (0, 0)
    reset_path(tmp_path, TP).write_text("{not json")
    with pytest.raises(ResetError, match="unreadable offsets reset record"):
        read_reset(tmp_path, TP)


def test_replay_resumes_and_maps_back_to_the_log() -> None:
    """A replay (reset below the landed head) starts at its target under the log's incarnation;
    after a restart mid-replay (the landed head carries the replay id) it resumes where it landed,
    still under the log's incarnation (the broker never sees the replay id); once the partition
    landed past the replayed range under the log's incarnation, the record is cleared."""
    log_inc, rid = "a" * 32, "b" * 32
    rec = ResetRecord(TP, 40, 100, log_inc, "now", replay_id=rid, replay_end=99)
    start = resume(rec, 100, log_inc)
    assert (start.outcome, start.position, start.incarnation, start.replayed) == ("applied", 40, log_inc, 60)
    assert start.replay == Replay(rid, log_inc, 99)
    mid = resume(rec, 70, rid)
    assert (mid.outcome, mid.position, mid.incarnation) == ("replaying", 70, log_inc)
    assert resume(rec, 100, rid).outcome == "replaying"  # replayed to the end, nothing newer yet
    assert resume(rec, 130, log_inc).outcome == "cleared"


def test_retag_splits_a_batch_at_the_replay_end() -> None:
    """Records up to the replay's end get the replay id; the rest keep the log's incarnation."""
    import pyarrow as pa

    from mqd.consumer.process_queue import FetchedBatch

    rb = pa.record_batch({"offset": pa.array(range(95, 105), pa.int64())})
    batch = FetchedBatch(TP, 1, rb, 95, 105, 100, incarnation="a" * 32)
    replay = Replay("b" * 32, "a" * 32, 99)
    head, tail = retag(batch, replay)
    assert (head.first_offset, head.next_offset, head.incarnation, head.records.num_rows) == (
        95,
        100,
        "b" * 32,
        5,
    )
    assert (tail.first_offset, tail.next_offset, tail.incarnation, tail.records.num_rows) == (
        100,
        105,
        "a" * 32,
        5,
    )
    assert retag(tail, replay) == [tail]
    other = FetchedBatch(TP, 1, rb, 95, 105, 100, incarnation="c" * 32)
    assert retag(other, replay) == [other]
