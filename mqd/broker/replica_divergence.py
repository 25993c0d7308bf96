"""Where two replicas' logs stop holding the same records, told by their incarnation histories.

Offsets alone cannot tell a slave that its master's log holds *other* records at the same offsets
(issue 13.2: a divergence whose batch boundaries line up). Two logs that share an incarnation id hold
the same records under it (ids are globally unique and only copied from master to slave), from its
base up to where either log's next incarnation begins, or its end. So the newest incarnation both
histories know gives the agreed end: everything before it is the same on both, everything after it
may differ. Kafka's leader-epoch truncation works the same way.

Histories that share no id (a new pair, or logs upgraded from before incarnations, each of which
began its own) agree on nothing by content: :func:`agreed_end` returns None and the caller falls
back to offsets and batch boundaries, as before incarnations.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqd.wire.incarnation import IncarnationEntry


def _end_of(entries: Sequence[IncarnationEntry], index: int, log_end: int) -> int:
    """Where the incarnation at ``index`` stops: the next entry's base, or the log end."""
    return entries[index + 1].base if index + 1 < len(entries) else log_end


def agreed_end(
    mine: Sequence[IncarnationEntry], my_end: int, theirs: Sequence[IncarnationEntry], their_end: int
) -> int | None:
    """The offset up to which both logs hold the same records (by their newest common incarnation);
    None when the histories share no incarnation."""
    their_index = {e.id: i for i, e in enumerate(theirs)}
    for i in range(len(mine) - 1, -1, -1):
        j = their_index.get(mine[i].id)
        if j is not None:
            return min(_end_of(mine, i, my_end), _end_of(theirs, j, their_end))
    return None
