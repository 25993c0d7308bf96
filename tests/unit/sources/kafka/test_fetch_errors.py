"""Kafka's Fetch answers onto the engine's statuses (mqd/sources/kafka/fetch_errors.py), row by row.

Proves that every partition answer the source can get (records or none; each error class; from the
leader or from a follower) gives the documented status, next offset, error text and follow-up
(epoch check, recheck of a truncated or recreated log, bounds passed on or not), including the
boundaries log start - 1 / log start and high watermark / high watermark + 1; and the bounds lookup
that OFFSET_OUT_OF_RANGE from the leader leads to. Pure functions: runs in milliseconds.
"""

from __future__ import annotations

import pytest

from mqd.consumer.source import FetchStatus
from mqd.sources.kafka.fetch_errors import (
    FENCED_LEADER_EPOCH,
    INCONSISTENT_TOPIC_ID,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    FetchOutcome,
    fetch_outcome,
    out_of_range_outcome,
)

FOUND, CAUGHT_UP, NOT_SERVED = FetchStatus.FOUND, FetchStatus.CAUGHT_UP, FetchStatus.NOT_SERVED
SMALL, BADLY = FetchStatus.OFFSET_TOO_SMALL, FetchStatus.OFFSET_OVERFLOW_BADLY
CORRUPT_MESSAGE = 2
LEADER, REPLICA = False, True
TO_LEADER = "OffsetOutOfRange on replica 7: asking the leader"

# the log holds [10, 20) (log start 10, high watermark 20)
# (case, error code, offset, records, found_end, on replica, outcome)
TABLE: list[tuple[str, int, int, bool, int | None, bool, FetchOutcome]] = [
    # records: FOUND, next where the whole batches end (the position when that is not past it)
    ("records", 0, 12, True, 15, LEADER, FetchOutcome(FOUND, 15)),
    ("records from a replica", 0, 12, True, 15, REPLICA, FetchOutcome(FOUND, 15)),
    ("records, no whole batch", 0, 12, True, None, LEADER, FetchOutcome(FOUND, 12)),
    ("records ending at the position", 0, 12, True, 12, LEADER, FetchOutcome(FOUND, 12)),
    ("records ending behind the position", 0, 12, True, 11, LEADER, FetchOutcome(FOUND, 12)),
    # no records inside the log or at its end: caught up (the broker long-polled)
    ("none at log start", 0, 10, False, None, LEADER, FetchOutcome(CAUGHT_UP, 10)),
    ("none at high watermark", 0, 20, False, None, LEADER, FetchOutcome(CAUGHT_UP, 20)),
    ("none at high watermark, replica", 0, 20, False, None, REPLICA, FetchOutcome(CAUGHT_UP, 20)),
    # beyond the high watermark: the log end (Tansu's answer; a truncation looks the same)
    (
        "none at hw + 1",
        0,
        21,
        False,
        None,
        LEADER,
        FetchOutcome(BADLY, 20, "beyond the log end", recheck=True),
    ),
    (
        "none far beyond",
        0,
        500,
        False,
        None,
        LEADER,
        FetchOutcome(BADLY, 20, "beyond the log end", recheck=True),
    ),
    # ... but a follower's high watermark trails the leader's (KIP-392): it serves later
    ("none at hw + 1, replica", 0, 21, False, None, REPLICA, FetchOutcome(CAUGHT_UP, 21)),
    # below the log start
    ("none at log start - 1", 0, 9, False, None, LEADER, FetchOutcome(SMALL, 10, "below the log start")),
    ("none at 0", 0, 0, False, None, REPLICA, FetchOutcome(SMALL, 10, "below the log start")),
    # OFFSET_OUT_OF_RANGE: the leader's bounds are looked up (after a recheck); a replica's are not
    ("out of range", OFFSET_OUT_OF_RANGE, 500, False, None, LEADER, FetchOutcome(None, 500, recheck=True)),
    (
        "out of range, replica",
        OFFSET_OUT_OF_RANGE,
        500,
        False,
        None,
        REPLICA,
        FetchOutcome(NOT_SERVED, 500, TO_LEADER, bounds=False),
    ),
    # a leader change: not served here, the position's epoch checked before the next fetch
    (
        "not leader",
        NOT_LEADER_OR_FOLLOWER,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "NotLeaderForPartitionError", check_epoch=True),
    ),
    (
        "not leader, replica",
        NOT_LEADER_OR_FOLLOWER,
        12,
        False,
        None,
        REPLICA,
        FetchOutcome(NOT_SERVED, 12, "NotLeaderForPartitionError", check_epoch=True),
    ),
    (
        "fenced epoch",
        FENCED_LEADER_EPOCH,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "UnknownError", check_epoch=True),
    ),
    (
        "unknown epoch",
        UNKNOWN_LEADER_EPOCH,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "UnknownError", check_epoch=True),
    ),
    # a topic gone: not served, rechecked (recreated under a new topic id?)
    (
        "unknown topic",
        UNKNOWN_TOPIC_OR_PARTITION,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "UnknownTopicOrPartitionError", recheck=True),
    ),
    (
        "unknown topic id",
        UNKNOWN_TOPIC_ID,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "UnknownError", recheck=True),
    ),
    (
        "inconsistent topic id",
        INCONSISTENT_TOPIC_ID,
        12,
        False,
        None,
        REPLICA,
        FetchOutcome(NOT_SERVED, 12, "UnknownError", recheck=True),
    ),
    # any other error: not served at the same position, nothing else; records with it are not read
    (
        "other error",
        CORRUPT_MESSAGE,
        12,
        False,
        None,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "CorruptRecordException"),
    ),
    (
        "other error with records",
        CORRUPT_MESSAGE,
        12,
        True,
        15,
        LEADER,
        FetchOutcome(NOT_SERVED, 12, "CorruptRecordException"),
    ),
    ("unknown code", 999, 12, False, None, REPLICA, FetchOutcome(NOT_SERVED, 12, "UnknownError")),
]


@pytest.mark.parametrize(
    ("case", "error_code", "offset", "records", "found_end", "on_replica", "outcome"),
    TABLE,
    ids=[row[0] for row in TABLE],
)
def test_table_row(
    case: str,
    error_code: int,
    offset: int,
    records: bool,
    found_end: int | None,
    on_replica: bool,
    outcome: FetchOutcome,
) -> None:
    """Each row, for a log holding [10, 20) as the answer gives its bounds."""
    got = fetch_outcome(
        error_code,
        offset=offset,
        highwater=20,
        log_start=10,
        records=records,
        found_end=found_end,
        on_replica=on_replica,
        node_id="7",
    )
    assert got == outcome


# an answer without a high watermark or a log start (-1) is never beyond the end or below the start:
# (highwater, log_start, offset, status, next_offset)
UNKNOWN_BOUNDS = [
    (-1, -1, 0, CAUGHT_UP, 0),
    (-1, -1, 500, CAUGHT_UP, 500),
    (-1, 10, 500, CAUGHT_UP, 500),
    (-1, 10, 9, SMALL, 10),
    (20, -1, 0, CAUGHT_UP, 0),
    (20, -1, 21, BADLY, 20),
]


@pytest.mark.parametrize(("highwater", "log_start", "offset", "status", "next_offset"), UNKNOWN_BOUNDS)
def test_bounds_the_answer_does_not_carry(
    highwater: int, log_start: int, offset: int, status: FetchStatus, next_offset: int
) -> None:
    got = fetch_outcome(
        0,
        offset=offset,
        highwater=highwater,
        log_start=log_start,
        records=False,
        found_end=None,
        on_replica=False,
        node_id="7",
    )
    assert (got.status, got.next_offset) == (status, next_offset)


# OFFSET_OUT_OF_RANGE once the leader's bounds [10, 20] are known: (case, offset, status, next)
BOUNDS_TABLE = [
    ("below the start", 9, SMALL, 10),
    ("at 0", 0, SMALL, 10),
    ("back in range at the start", 10, CAUGHT_UP, 10),
    ("back in range", 15, CAUGHT_UP, 15),
    ("back in range at the end", 20, CAUGHT_UP, 20),
    ("beyond the end", 21, BADLY, 20),
    ("far beyond", 500, BADLY, 20),
]


@pytest.mark.parametrize(
    ("case", "offset", "status", "next_offset"), BOUNDS_TABLE, ids=[r[0] for r in BOUNDS_TABLE]
)
def test_out_of_range_after_the_bounds_lookup(
    case: str, offset: int, status: FetchStatus, next_offset: int
) -> None:
    assert out_of_range_outcome(offset, 10, 20) == (status, next_offset)
