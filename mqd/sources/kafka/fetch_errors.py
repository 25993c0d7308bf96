"""Kafka's answer for one partition of a Fetch, onto the engine's statuses: a pure table.

Given a partition's error code in a Fetch answer, the position fetched and the bounds the answer
carries, :func:`fetch_outcome` says which :class:`mqd.consumer.source.FetchStatus` the engine gets,
the offset it should fetch next, and what the source must do before passing it on (source.py does
it: no I/O here):

- records: FOUND, next at the end of their whole batches; none: CAUGHT_UP (the broker long-polled);
- no records at a position beyond the high watermark: OFFSET_OVERFLOW_BADLY (next: the high
  watermark; Kafka answers OFFSET_OUT_OF_RANGE there, Tansu nothing, forever), rechecked first as a
  truncated or recreated log gives the same answer; from a follower (KIP-392) CAUGHT_UP instead (its
  high watermark trails the leader's); below the log start: OFFSET_TOO_SMALL (next: the log start);
- OFFSET_OUT_OF_RANGE from the leader names no valid offset: the bounds are looked up (ListOffsets)
  and :func:`out_of_range_outcome` decides, after the same recheck; from a follower it is
  NOT_SERVED with no bounds, and the leader is asked (never a reset on a replica's word);
- any other error: NOT_SERVED at the same position, named by aiokafka's error class. A leader
  change (NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH) has the position's epoch checked
  before the next fetch; a topic gone (UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID,
  INCONSISTENT_TOPIC_ID) is rechecked (the topic may have been recreated).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.errors import for_code

from mqd.consumer.source import FetchStatus

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
UNKNOWN_TOPIC_ID = 100
INCONSISTENT_TOPIC_ID = 103
EPOCH_ERRORS = frozenset({NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH})
TOPIC_GONE = frozenset({UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID})


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """The table's answer for one partition: ``status`` None when the bounds must be looked up
    first (OFFSET_OUT_OF_RANGE from the leader: :func:`out_of_range_outcome` decides)."""

    status: FetchStatus | None
    next_offset: int
    error: str | None = None
    # a leader change: the position's leader epoch is checked before the partition is fetched again
    check_epoch: bool = False
    # an answer a truncated or recreated log also gives: metadata and epoch are read again first
    recheck: bool = False
    # the answer's log start and end are passed on (False: a follower's, which the leader's replace)
    bounds: bool = True


def error_name(error_code: int) -> str:
    """aiokafka's name for a Kafka error code (``NotLeaderForPartitionError``, ...)."""
    name: str = for_code(error_code).__name__
    return name


def fetch_outcome(
    error_code: int,
    *,
    offset: int,
    highwater: int,
    log_start: int,
    records: bool,
    found_end: int | None,
    on_replica: bool,
    node_id: str,
) -> FetchOutcome:
    """The outcome of partition answer ``error_code`` for a fetch at ``offset``: ``records`` the
    answer holds some, ``found_end`` the offset after its last whole record batch (None: none
    whole), ``on_replica`` it came from a follower (``node_id``), not the leader."""
    if error_code == OFFSET_OUT_OF_RANGE:
        if on_replica:
            # a replica's log can end before the leader's or start after it: the leader says
            # (Kafka's consumer does the same), never a reset on a replica's word
            why = f"OffsetOutOfRange on replica {node_id}: asking the leader"
            return FetchOutcome(FetchStatus.NOT_SERVED, offset, why, bounds=False)
        return FetchOutcome(None, offset, recheck=True)
    if error_code:
        return FetchOutcome(
            FetchStatus.NOT_SERVED,
            offset,
            error_name(error_code),
            check_epoch=error_code in EPOCH_ERRORS,
            recheck=error_code in TOPIC_GONE,
        )
    if records:
        # the engine fetches on from where the whole batches end
        return FetchOutcome(
            FetchStatus.FOUND, found_end if found_end is not None and found_end > offset else offset
        )
    if on_replica and offset > highwater >= 0:
        # a follower's high watermark trails the leader's (KIP-392): it long-polled, and serves once
        # its own catches up; its log end (LEO) is beyond our position, or it would have answered
        # OFFSET_OUT_OF_RANGE
        return FetchOutcome(FetchStatus.CAUGHT_UP, offset)
    if offset > highwater >= 0:
        # Kafka answers OFFSET_OUT_OF_RANGE here; Tansu answers nothing, forever
        return FetchOutcome(FetchStatus.OFFSET_OVERFLOW_BADLY, highwater, "beyond the log end", recheck=True)
    if 0 <= offset < log_start:
        return FetchOutcome(FetchStatus.OFFSET_TOO_SMALL, log_start, "below the log start")
    return FetchOutcome(FetchStatus.CAUGHT_UP, offset)


def out_of_range_outcome(offset: int, start: int, end: int) -> tuple[FetchStatus, int]:
    """Status and next offset for OFFSET_OUT_OF_RANGE at ``offset`` once the leader's log start and
    end are known: below the start, beyond the end, or back in range by now (just ask again)."""
    if offset < start:
        return FetchStatus.OFFSET_TOO_SMALL, start
    if offset > end:
        return FetchStatus.OFFSET_OVERFLOW_BADLY, end
    return FetchStatus.CAUGHT_UP, offset
