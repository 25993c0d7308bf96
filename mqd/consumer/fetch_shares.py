"""How one fetch request's bytes are shared among its partitions (issue 16).

A request to a node may bring back ``min(fetch_max_bytes, partitions x partition_max_bytes)``
(and what the byte budget has left). Giving every partition a fixed ``partition_max_bytes`` of it
wastes the shares of partitions that are caught up: on a node where one partition holds the backlog
and the others have nothing, that partition got one 4 MiB answer per round trip while the request
could carry four times as much. So the bytes go by what exists: a partition known to be caught up
(its last answer reached the log end) keeps ``partition_max_bytes`` (new records are usually far
fewer), and the partitions with a backlog share the whole request, each at least
``partition_max_bytes``. The broker fills an answer in request order, each partition up to its own
``max_bytes`` and the answer up to the request's, so the caught-up partitions go first (they take
what they have, little) and the partitions with a backlog follow in an order that rotates from
request to request: one of them coming first each time would starve the others whenever the
request's bytes run out before the end of the list.

Pure logic: no I/O, no clock; the node fetcher calls it once per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestShares:
    """Request order (indexes into the partitions given) and each one's ``max_bytes``, in that order."""

    order: list[int]
    max_bytes: list[int]


def share_request(backlog: Sequence[bool], total: int, partition_max_bytes: int, turn: int) -> RequestShares:
    """Shares of a request of ``total`` bytes; ``backlog[i]``: partition i may have more than its
    last answer reached (unknown counts as a backlog); ``turn``: a counter the caller advances per
    request, which rotates the order of the partitions with a backlog."""
    if total < 1:
        raise ValueError(f"a request's max_bytes is at least 1, got {total}")
    least = min(partition_max_bytes, total)
    idle = [i for i, more in enumerate(backlog) if not more]
    busy = [i for i, more in enumerate(backlog) if more]
    if busy:
        start = turn % len(busy)
        busy = busy[start:] + busy[:start]
    share = max(least, total // len(busy)) if busy else least
    return RequestShares(idle + busy, [least] * len(idle) + [share] * len(busy))
