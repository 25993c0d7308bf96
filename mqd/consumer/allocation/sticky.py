"""``sticky``: balanced shares, and a member change moves only what it must (Kafka's StickyAssignor).

Every member gets ``n // m`` partitions, and ``n % m`` of them one more. What moves on a change:

- *Knowing what each member owns* (the Kafka source: each member names its partitions and their
  generation in its subscription, and the elected leader assigns for all): a member keeps what it
  owns up to its quota, the members owning most keeping the extra ones; only what is left over (a
  departed member's partitions, new partitions, what a member holds beyond its quota) goes to the
  members under their quota. A joining member takes only what the others must give up to balance;
  a leaving member's partitions alone move.
- *Knowing only the member list* (the mqd broker's protocol, where every member computes the whole
  allocation from the sorted member list on its own, and a Kafka group's first generation): each
  partition starts with the member that scores it highest (rendezvous hashing), then the same
  balancing runs. A joining member takes the partitions it now scores highest for; a leaving one
  frees its own; balancing moves a few more (the member list alone cannot say who owned what).

Which partitions a member over its quota gives up, and which member under its quota takes a free
one, is decided by the same scores, so the result depends on the inputs only, never on their order.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TypeVar

from mqd.consumer.allocation.consistent_hash import stable_hash

T = TypeVar("T")


def assign_sticky(
    members: Sequence[str],
    partitions: Sequence[T],
    owned: Mapping[str, Collection[T]] | None = None,
) -> dict[str, list[T]]:
    """Every member's share (in ``partitions``' order); ``owned``: what each member holds now, None
    when not known. A partition two members claim stays with the first of them by name (the Kafka
    group drops claims of an older generation before it asks)."""
    ms = sorted(set(members))
    order = {p: i for i, p in enumerate(dict.fromkeys(partitions))}
    ps = sorted(order, key=str)  # the inputs' order must not matter, and T need not be orderable
    if not ms:
        return {}
    base, extras = divmod(len(ps), len(ms))
    scores: dict[tuple[str, T], int] = {}

    def score(member: str, p: T) -> int:
        key = (member, p)
        s = scores.get(key)
        if s is None:
            s = scores[key] = stable_hash(f"{member}\x00{p}")
        return s

    start: dict[str, list[T]] = {m: [] for m in ms}
    if owned is None:
        for p in ps:
            start[max(ms, key=lambda m: (score(m, p), m))].append(p)
    else:
        known = set(ps)
        for m in ms:
            for p in dict.fromkeys(owned.get(m, ())):
                if p in known:
                    start[m].append(p)
                    known.discard(p)

    # keep up to the quota: the members holding most keep the extra partitions
    share: dict[str, list[T]] = {}
    for m in sorted(ms, key=lambda m: (-len(start[m]), m)):
        cap = base
        if extras and len(start[m]) > base:
            cap, extras = base + 1, extras - 1
        share[m] = sorted(start[m], key=lambda p: (-score(m, p), str(p)))[:cap]

    # what is left over goes to the members under their quota, each to the one scoring it highest
    taken = {p for held in share.values() for p in held}
    for p in ps:
        if p in taken:
            continue
        under = [m for m in ms if len(share[m]) < base]
        if not under:  # everyone at base: what is left is the unused extras, one to a member
            under = [m for m in ms if len(share[m]) == base]
        share[max(under, key=lambda m: (score(m, p), m))].append(p)

    return {m: sorted(share[m], key=order.__getitem__) for m in ms}


def allocate_sticky(consumer_id: str, members: Sequence[str], partitions: Sequence[T]) -> list[T]:
    """This member's share when only the member list is known (the per-member strategy form)."""
    if consumer_id not in members:
        return []
    return assign_sticky(members, partitions)[consumer_id]
