"""Which node a consumer should pull a partition from next (DESIGN.md §1 "Slave suggestion"), pure.

RocketMQ moves a consumer whose read is cold (more than 40 % of RAM behind the head) to a slave;
mqd makes that a byte threshold (``slave_suggest_lag_bytes``):

- a master suggests a live slave when the consumer is more than the threshold behind the head, and
  only a slave that holds where the consumer goes next and is itself within half the threshold of
  the head (so it will not send the consumer straight back);
- a slave keeps only consumers that are still more than half the threshold behind; every other one
  (near the head, or at an offset a replica cannot judge: too small, too big, empty) goes back to
  the authoritative master, unless the master is down;
- no suggestion (None) means "stay where you are".

Distances come from a ``bytes_behind(offset)`` callable (the log's index, no I/O), so the rules
are tested with plain functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mqd.wire.protocol import Status

# bytes from the batch holding an offset to the head of the log
BytesBehind = Callable[[int], int]


def master_suggestion(
    status: Status,
    offset: int,
    next_offset: int,
    bytes_behind: BytesBehind,
    threshold: int,
    slave_ends: Callable[[], Iterable[tuple[str, int]]],
) -> str | None:
    """On a master: the slave to pull from next, or None. ``slave_ends()`` gives the live slaves
    in layout order with the next offset each asked for (its log end; -1 when it has not asked
    yet); it is called only for a consumer that is far behind, the rare case on the fetch path."""
    if status is not Status.FOUND or bytes_behind(offset) <= threshold:
        return None
    for slave_id, end in slave_ends():
        if end > next_offset and bytes_behind(end) <= threshold // 2:
            return slave_id
    return None


def slave_suggestion(
    status: Status,
    next_offset: int,
    bytes_behind: BytesBehind,
    threshold: int,
    master_id: str,
    master_alive: bool,
) -> str | None:
    """On a slave: the master when the consumer should go back to it, else None."""
    if not master_alive:
        return None
    if status is Status.FOUND and bytes_behind(next_offset) > threshold // 2:
        return None
    return master_id
