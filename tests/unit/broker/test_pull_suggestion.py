"""Master/slave pull suggestion (mqd/broker/pull_suggestion.py), case by case.

Proves the rules of DESIGN.md §1 "Slave suggestion" with a byte threshold: a master sends a
far-behind consumer to the first live slave that holds its next offset and is near the head; a
slave keeps far-behind consumers and sends the others back to a live master; nothing is suggested
for a dead master or when no slave qualifies. Pure functions over a linear ``bytes_behind``.
"""

from __future__ import annotations

import pytest

from mqd.broker.pull_suggestion import master_suggestion, slave_suggestion
from mqd.wire.protocol import Status

HEAD = 1000  # the log's end offset; each record is 10 bytes
THRESHOLD = 4000  # far behind: more than 400 records; a slave is near the head within 200


def behind(offset: int) -> int:
    return max(0, HEAD - offset) * 10


# (case, status, offset, next_offset, slave_ends, expected)
MASTER_CASES = [
    ("near the head stays", Status.FOUND, 700, 710, [("s1", HEAD)], None),
    ("exactly at threshold stays", Status.FOUND, 600, 610, [("s1", HEAD)], None),
    ("far behind goes to the caught-up slave", Status.FOUND, 599, 610, [("s1", HEAD)], "s1"),
    ("slave not yet asked (-1)", Status.FOUND, 0, 10, [("s1", -1)], None),
    ("slave does not hold next_offset", Status.FOUND, 0, 10, [("s1", 10)], None),
    ("slave just past next_offset but lagging", Status.FOUND, 0, 10, [("s1", 11)], None),
    ("slave lag exactly half the threshold", Status.FOUND, 0, 10, [("s1", 800)], "s1"),
    ("slave lag just over half the threshold", Status.FOUND, 0, 10, [("s1", 799)], None),
    (
        "first qualifying slave in layout order",
        Status.FOUND,
        0,
        10,
        [("s1", 5), ("s2", 900), ("s3", HEAD)],
        "s2",
    ),
    ("no live slaves", Status.FOUND, 0, 10, [], None),
    ("not FOUND: too small", Status.OFFSET_TOO_SMALL, 0, 100, [("s1", HEAD)], None),
    ("not FOUND: overflow one", Status.OFFSET_OVERFLOW_ONE, HEAD, HEAD, [("s1", HEAD)], None),
    ("not FOUND: overflow badly", Status.OFFSET_OVERFLOW_BADLY, 5000, 0, [("s1", HEAD)], None),
    ("not FOUND: empty", Status.NO_MESSAGE_IN_QUEUE, 0, 0, [("s1", HEAD)], None),
]


@pytest.mark.parametrize(
    ("case", "status", "offset", "next_offset", "ends", "expected"),
    MASTER_CASES,
    ids=[c[0] for c in MASTER_CASES],
)
def test_master(
    case: str,
    status: Status,
    offset: int,
    next_offset: int,
    ends: list[tuple[str, int]],
    expected: str | None,
) -> None:
    """A master's suggestion for each case."""
    assert master_suggestion(status, offset, next_offset, behind, THRESHOLD, lambda: ends) == expected


# (case, status, next_offset, master_alive, expected)
SLAVE_CASES = [
    ("far behind stays on the slave", Status.FOUND, 0, True, None),
    ("just over half the threshold stays", Status.FOUND, 799, True, None),
    ("exactly half the threshold goes back", Status.FOUND, 800, True, "m"),
    ("caught up goes back to the master", Status.FOUND, 990, True, "m"),
    ("caught up, master dead: stay", Status.FOUND, 990, False, None),
    ("far behind, master dead: stay", Status.FOUND, 0, False, None),
    ("overflow one goes back", Status.OFFSET_OVERFLOW_ONE, HEAD, True, "m"),
    ("overflow badly goes back", Status.OFFSET_OVERFLOW_BADLY, 5000, True, "m"),
    ("too small goes back", Status.OFFSET_TOO_SMALL, 0, True, "m"),
    ("empty goes back", Status.NO_MESSAGE_IN_QUEUE, 0, True, "m"),
    ("empty, master dead: stay", Status.NO_MESSAGE_IN_QUEUE, 0, False, None),
]


@pytest.mark.parametrize(
    ("case", "status", "next_offset", "alive", "expected"), SLAVE_CASES, ids=[c[0] for c in SLAVE_CASES]
)
def test_slave(case: str, status: Status, next_offset: int, alive: bool, expected: str | None) -> None:
    """A slave's suggestion for each case."""
    assert slave_suggestion(status, next_offset, behind, THRESHOLD, "m", alive) == expected


def test_master_reads_slave_ends_lazily() -> None:
    """A consumer near the head, or a status other than FOUND, costs no look at the slaves."""

    def ends() -> list[tuple[str, int]]:
        raise AssertionError("slave progress read for a consumer near the head")

    assert master_suggestion(Status.FOUND, 990, 995, behind, THRESHOLD, ends) is None
    assert master_suggestion(Status.OFFSET_TOO_SMALL, 0, 100, behind, THRESHOLD, ends) is None
