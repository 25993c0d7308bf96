"""Partition allocation strategies (RocketMQ's AllocateMessageQueueStrategy), one per file, and
their registry.

A strategy is a pure function ``(consumer_id, members, partitions) -> owned partitions``. Every
member calls it with the same sorted member list and the same sorted partition list, so every member
computes the same global allocation without talking to the others: each partition is owned by
exactly one member. A consumer that is not in ``members`` gets nothing.

Where one member assigns for all (a Kafka group's elected leader), :func:`allocate_group` gives every
member's share at once, and a strategy that can use what each member owns now (``sticky``) gets it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from mqd.consumer.allocation.averagely import allocate_averagely
from mqd.consumer.allocation.averagely_by_circle import allocate_averagely_by_circle
from mqd.consumer.allocation.consistent_hash import allocate_consistent_hash, make_consistent_hash
from mqd.consumer.allocation.sticky import allocate_sticky, assign_sticky
from mqd.consumer.errors import ConsumerError

T = TypeVar("T")

# (consumer_id, sorted members, sorted partitions) -> the partitions consumer_id owns
Strategy = Callable[[str, Sequence[str], Sequence[T]], list[T]]

# (members, partitions, what each member owns now or None) -> every member's share
GroupStrategy = Callable[[Sequence[str], Sequence[T], Mapping[str, Collection[T]] | None], dict[str, list[T]]]

_STRATEGIES: dict[str, Strategy[Any]] = {}
_GROUP_FORMS: dict[str, GroupStrategy[Any]] = {}  # strategies that assign for all at once


def register_strategy(name: str, fn: Strategy[Any]) -> None:
    """Make ``fn`` available as ``consumer.allocation = name`` (replaces an earlier one)."""
    if not name:
        raise ValueError("a strategy needs a name")
    _STRATEGIES[name] = fn
    _GROUP_FORMS.pop(name, None)


def get_strategy(name: str) -> Strategy[Any]:
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ConsumerError(
            f"unknown allocation strategy {name!r}; known: {', '.join(sorted(_STRATEGIES))}"
        ) from None


def strategy_names() -> list[str]:
    return sorted(_STRATEGIES)


def allocate_group(
    name: str,
    members: Sequence[str],
    partitions: Sequence[T],
    owned: Mapping[str, Collection[T]] | None = None,
) -> dict[str, list[T]]:
    """Every member's share by strategy ``name``; ``owned`` (what each member holds now) is used by
    the strategies that stick to it and ignored by the others."""
    group_form = _GROUP_FORMS.get(name)
    if group_form is not None:
        return group_form(members, partitions, owned)
    fn = get_strategy(name)
    ms = sorted(set(members))
    return {m: fn(m, ms, partitions) for m in ms}


register_strategy("averagely", allocate_averagely)
register_strategy("averagely-by-circle", allocate_averagely_by_circle)
register_strategy("consistent-hash", allocate_consistent_hash)
register_strategy("sticky", allocate_sticky)
_GROUP_FORMS["sticky"] = assign_sticky

__all__ = [
    "GroupStrategy",
    "Strategy",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "allocate_consistent_hash",
    "allocate_group",
    "allocate_sticky",
    "assign_sticky",
    "get_strategy",
    "make_consistent_hash",
    "register_strategy",
    "strategy_names",
]
