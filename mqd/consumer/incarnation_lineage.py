"""A partition's incarnation lineage: the log incarnations the consumer fetched under before its
current one, each with the first offset it fetched under the next (oldest first).

Every fetch names the incarnation its position belongs to; a log that no longer holds that id
answers INCARNATION_CHANGED with where the records diverged, and 0 when it never heard of the id.
That happens without any record being replaced: a master restarted uncleanly begins a new
incarnation at its log end (the consumer follows it, nothing fetched affected), then loses its data
dir before its slave learnt the new id, and takes its records back from that slave under yet another
id whose history goes back to the older one. The broker cannot know the lost id, but it knows the
older one the consumer fetched under before, so the fetch names the lineage too and the broker
answers where the consumer's records really stop being its log's (mqd/broker/incarnation.py,
``IncarnationHistory.diverged_for``). Without it the consumer started over at 0 and landed every
record of the log a second time (the chaos run's seed 587328: 3,680 duplicates).

Pure functions over tuples, so the rule is unit-tested without a broker.
"""

from __future__ import annotations

Lineage = tuple[tuple[str, int], ...]

# ids kept per partition: the newest changes are the ones a log may have lost; older ones only
# matter when a log lost several incarnations at once (a source may carry fewer: the mqd broker's
# wire takes 8, mqd.wire.incarnation.MAX_LINEAGE)
MAX_LINEAGE = 8


def after_change(lineage: Lineage, old: str | None, boundary: int) -> Lineage:
    """The lineage once the consumer leaves incarnation ``old`` at ``boundary`` (the first offset
    it fetches under the new one: its position, or the divergence point below it).

    The entries are contiguous: each id covers the offsets from the previous entry's end to its
    own. Records at or after ``boundary`` no longer count as fetched under any earlier id, so the
    ends are cut there and an id left covering nothing is dropped; ``old`` covers what lies between
    the last end and the boundary."""
    kept: list[tuple[str, int]] = []
    start = 0
    for i, end in lineage:
        if start >= boundary:
            break
        kept.append((i, min(end, boundary)))
        start = end
    if old is not None and start < boundary:
        kept.append((old, boundary))
    return tuple(kept[-MAX_LINEAGE:])
