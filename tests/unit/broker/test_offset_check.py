"""The offset-status table of DESIGN.md §1 (mqd/broker/offset_check.py), row by row.

Proves that every row of the design's table gives the documented status and next offset for a
master, for a slave (default: keeps the requested offset) and for a slave with
``offset_check_in_slave`` (corrects like a master), including the boundaries min-1/min, max-1/max/
max+1, and which answers may be held by a long poll. Pure function: runs in milliseconds.
"""

from __future__ import annotations

import pytest

from mqd.broker.offset_check import OffsetCheck, check_offset
from mqd.wire.protocol import Status

MASTER = {"is_master": True, "offset_check_in_slave": False}
SLAVE = {"is_master": False, "offset_check_in_slave": False}
CHECKING_SLAVE = {"is_master": False, "offset_check_in_slave": True}
ROLES = {"master": MASTER, "slave": SLAVE, "checking_slave": CHECKING_SLAVE}

F, E = Status.FOUND, Status.NO_MESSAGE_IN_QUEUE
SMALL, ONE, BADLY = Status.OFFSET_TOO_SMALL, Status.OFFSET_OVERFLOW_ONE, Status.OFFSET_OVERFLOW_BADLY

# (case, offset, min, max, role, status, next_offset, waitable)
TABLE = [
    # queue empty: a master (or checking slave) corrects to 0, a slave keeps the offset
    ("empty at 0", 0, 0, 0, "master", E, 0, True),
    ("empty at 0", 0, 0, 0, "slave", E, 0, True),
    ("empty at 0", 0, 0, 0, "checking_slave", E, 0, True),
    ("empty at 7", 7, 0, 0, "master", E, 0, False),
    ("empty at 7", 7, 0, 0, "slave", E, 7, True),
    ("empty at 7", 7, 0, 0, "checking_slave", E, 0, False),
    # offset < min: corrected to min by an authoritative node
    ("below min", 0, 10, 20, "master", SMALL, 10, False),
    ("below min", 0, 10, 20, "slave", SMALL, 0, False),
    ("below min", 0, 10, 20, "checking_slave", SMALL, 10, False),
    ("min - 1", 9, 10, 20, "master", SMALL, 10, False),
    ("min - 1", 9, 10, 20, "slave", SMALL, 9, False),
    ("min - 1", 9, 10, 20, "checking_slave", SMALL, 10, False),
    # min <= offset < max: found (next_offset is the caller's after reading)
    ("at min", 10, 10, 20, "master", F, 10, True),
    ("at min", 10, 10, 20, "slave", F, 10, True),
    ("at min", 10, 10, 20, "checking_slave", F, 10, True),
    ("max - 1", 19, 10, 20, "master", F, 19, True),
    ("max - 1", 19, 10, 20, "slave", F, 19, True),
    ("max - 1", 19, 10, 20, "checking_slave", F, 19, True),
    ("at 0 of full log", 0, 0, 20, "master", F, 0, True),
    # offset == max: the requested offset, long-polled everywhere
    ("at max", 20, 10, 20, "master", ONE, 20, True),
    ("at max", 20, 10, 20, "slave", ONE, 20, True),
    ("at max", 20, 10, 20, "checking_slave", ONE, 20, True),
    # offset > max: 0 when min == 0 else max; a plain slave keeps it and may still get there
    ("max + 1, min 0", 21, 0, 20, "master", BADLY, 0, False),
    ("max + 1, min 0", 21, 0, 20, "slave", BADLY, 21, True),
    ("max + 1, min 0", 21, 0, 20, "checking_slave", BADLY, 0, False),
    ("far above, min > 0", 500, 10, 20, "master", BADLY, 20, False),
    ("far above, min > 0", 500, 10, 20, "slave", BADLY, 500, True),
    ("far above, min > 0", 500, 10, 20, "checking_slave", BADLY, 20, False),
    # every record deleted by retention: min == max > 0
    ("retained away, at max", 20, 20, 20, "master", ONE, 20, True),
    ("retained away, below", 5, 20, 20, "master", SMALL, 20, False),
    ("retained away, below", 5, 20, 20, "slave", SMALL, 5, False),
]


@pytest.mark.parametrize(
    ("case", "offset", "lo", "hi", "role", "status", "next_offset", "waitable"),
    TABLE,
    ids=[f"{row[0]}-{row[4]}" for row in TABLE],
)
def test_table_row(
    case: str, offset: int, lo: int, hi: int, role: str, status: Status, next_offset: int, waitable: bool
) -> None:
    """Each row of DESIGN.md §1's table, per role."""
    assert check_offset(offset, lo, hi, **ROLES[role]) == OffsetCheck(status, next_offset, waitable)


@pytest.mark.parametrize("role", sorted(ROLES))
def test_not_served_keeps_the_offset(role: str) -> None:
    """A partition this node does not serve answers NOT_SERVED at the requested offset, at once."""
    got = check_offset(42, 10, 20, served=False, **ROLES[role])
    assert got == OffsetCheck(Status.NOT_SERVED, 42, waitable=False)


def test_every_status_row_is_covered() -> None:
    """The table above reaches every offset status of the design for every role."""
    for role in ROLES:
        seen = {row[5] for row in TABLE if row[4] == role}
        assert seen == {F, E, SMALL, ONE, BADLY}, role


def test_a_plain_slave_never_moves_the_consumer() -> None:
    """Over a grid of offsets and bounds, a default slave's next offset is the requested one."""
    for lo in (0, 3, 10):
        for hi in (0, lo, lo + 1, lo + 10):
            for offset in range(0, hi + 5):
                got = check_offset(offset, lo, hi, **SLAVE)
                if got.status is not F:
                    assert got.next_offset == offset, (offset, lo, hi)


CHANGED, LOST = Status.INCARNATION_CHANGED, Status.DATA_LOST

# (case, offset, min, max, role, extra arguments, status, next_offset, waitable)
INCARNATION_TABLE = [
    # a known, earlier incarnation: every role answers the divergence (a slave's history is a
    # prefix of its master's, so it gives the same point), never with records, at once
    ("diverged before the position", 30, 0, 40, "master", {"diverged_at": 20}, CHANGED, 20, False),
    ("diverged before the position", 30, 0, 40, "slave", {"diverged_at": 20}, CHANGED, 20, False),
    ("diverged after the position", 10, 0, 40, "master", {"diverged_at": 20}, CHANGED, 10, False),
    ("diverged at the position", 20, 0, 40, "checking_slave", {"diverged_at": 20}, CHANGED, 20, False),
    ("changed on an empty log", 7, 0, 0, "master", {"diverged_at": 0}, CHANGED, 0, False),
    ("changed beyond the end", 90, 0, 40, "master", {"diverged_at": 35}, CHANGED, 35, False),
    # an id this log's history does not hold: the master says 0, a slave cannot judge (maybe newer)
    ("unknown id", 30, 0, 40, "master", {"diverged_at": 0, "incarnation_known": False}, CHANGED, 0, False),
    ("unknown id", 30, 0, 40, "slave", {"diverged_at": 0, "incarnation_known": False}, BADLY, 30, False),
    (
        "unknown id",
        30,
        0,
        40,
        "checking_slave",
        {"diverged_at": 0, "incarnation_known": False},
        BADLY,
        30,
        False,
    ),
    # a fenced hole: the master answers DATA_LOST pointing after it; a slave keeps the offset
    ("in a hole", 12, 0, 40, "master", {"lost_last": 15}, LOST, 16, False),
    ("in a hole", 12, 0, 40, "slave", {"lost_last": 15}, BADLY, 12, False),
    ("in a hole", 12, 0, 40, "checking_slave", {"lost_last": 15}, BADLY, 12, False),
    # the incarnation answer comes first: a hole is not reported under another incarnation
    ("changed and in a hole", 12, 0, 40, "master", {"diverged_at": 5, "lost_last": 15}, CHANGED, 5, False),
]


@pytest.mark.parametrize(
    ("case", "offset", "lo", "hi", "role", "extra", "status", "next_offset", "waitable"),
    INCARNATION_TABLE,
    ids=[f"{row[0]}-{row[4]}" for row in INCARNATION_TABLE],
)
def test_incarnation_and_hole_rows(
    case: str,
    offset: int,
    lo: int,
    hi: int,
    role: str,
    extra: dict[str, object],
    status: Status,
    next_offset: int,
    waitable: bool,
) -> None:
    """INCARNATION_CHANGED and DATA_LOST (issue 12), per role: who may move the consumer and where."""
    got = check_offset(offset, lo, hi, **ROLES[role], **extra)  # type: ignore[arg-type]
    assert got == OffsetCheck(status, next_offset, waitable)
