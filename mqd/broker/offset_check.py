"""The offset-status table of DESIGN.md §1 (RocketMQ's ``DefaultMessageStore.getMessage``), pure.

Given the offset a fetch asks for and the bounds of the partition's log, :func:`check_offset`
answers the fetch status, the offset the consumer should ask for next, and whether the fetch may
be held (long-polled) for this partition. It does no I/O: for FOUND the caller reads the records
and replaces ``next_offset`` with the offset after the last record it returns.

A master is authoritative and corrects a bad offset; a slave keeps the requested offset (its log
may only lag, and a lagging replica must never move a consumer) unless ``offset_check_in_slave``
makes it check offsets like a master.

Two answers come before and after the offset table (issue 12). A request naming an incarnation
that is not the log's current one gets INCARNATION_CHANGED (no records; the caller adds
``diverged_at``), before anything else: its offset may name other records here. An offset inside a
fenced range (damaged, not repairable) gets DATA_LOST with the offset after the hole. A slave
answers neither when it cannot judge (an incarnation its history does not know yet, a hole that
may be only its own): it keeps the offset as OFFSET_OVERFLOW_BADLY, not held, so the consumer asks
the master, which can.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqd.wire.protocol import Status


@dataclass(slots=True)
class OffsetCheck:
    """The table's answer for one partition of a fetch (not frozen: one is made per partition of
    every fetch attempt, and a frozen dataclass costs three times as much to build)."""

    status: Status
    next_offset: int
    # the fetch may be held for this partition; False when the client must act on the answer now
    # (a moved offset, a partition this node does not serve)
    waitable: bool


def check_offset(
    offset: int,
    min_offset: int,
    max_offset: int,
    *,
    served: bool = True,
    is_master: bool,
    offset_check_in_slave: bool = False,
    diverged_at: int | None = None,
    incarnation_known: bool = True,
    lost_last: int | None = None,
) -> OffsetCheck:
    """Status and next offset for a fetch at ``offset`` of a log holding ``[min_offset, max_offset)``.

    ``served`` False (the partition is not in this node's broker group, or unknown to the cluster)
    answers NOT_SERVED and keeps the offset. An empty queue is one whose ``max_offset`` is 0.
    ``diverged_at`` is not None when the request named an incarnation other than the current one
    (the log's divergence point for it); ``incarnation_known`` False when this log's history does not
    hold that id at all. ``lost_last`` is not None when ``offset`` lies in a fenced range ending there.
    """
    if not served:
        return OffsetCheck(Status.NOT_SERVED, offset, False)
    # a master corrects offsets; a slave only when configured like RocketMQ's offsetCheckInSlave
    authoritative = is_master or offset_check_in_slave
    if diverged_at is not None:
        if not incarnation_known and not is_master:
            # maybe newer than this slave's copy of the history: only the master can tell
            return OffsetCheck(Status.OFFSET_OVERFLOW_BADLY, offset, False)
        # records from diverged_at on are not the ones the consumer's position counted
        return OffsetCheck(Status.INCARNATION_CHANGED, min(offset, diverged_at), False)
    if max_offset == 0:
        next_offset = 0 if authoritative else offset
        # only a corrected offset is urgent: a consumer already at 0 waits for the first record
        return OffsetCheck(Status.NO_MESSAGE_IN_QUEUE, next_offset, next_offset == offset)
    if offset < min_offset:
        return OffsetCheck(Status.OFFSET_TOO_SMALL, min_offset if authoritative else offset, False)
    if offset == max_offset:
        return OffsetCheck(Status.OFFSET_OVERFLOW_ONE, offset, True)
    if offset > max_offset:
        if authoritative:
            return OffsetCheck(Status.OFFSET_OVERFLOW_BADLY, 0 if min_offset == 0 else max_offset, False)
        # a lagging slave may still get there: hold the fetch like an OVERFLOW_ONE
        return OffsetCheck(Status.OFFSET_OVERFLOW_BADLY, offset, True)
    if lost_last is not None:
        if not is_master:
            # maybe a hole in this replica only: the master may still hold these records
            return OffsetCheck(Status.OFFSET_OVERFLOW_BADLY, offset, False)
        return OffsetCheck(Status.DATA_LOST, lost_last + 1, False)
    return OffsetCheck(Status.FOUND, offset, True)
