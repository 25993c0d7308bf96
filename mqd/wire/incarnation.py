"""Incarnations as the wire carries them: an entry (id, base), the id's shape, the rules over a list of
entries, and their JSON. A partition log's durable history of them is the broker's
(mqd/broker/incarnation.py, which explains what an incarnation is); the consumer, the mqd source and the
fetch protocol use these alone, so they do not import the broker.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mqd.errors import MqdError

_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_LINEAGE = 8  # earlier incarnations a fetch may name per partition (the wire's limit)


class IncarnationError(MqdError):
    """A history file or a history from a peer that breaks the rules (ids, bases, order)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


@dataclass(frozen=True, slots=True)
class IncarnationEntry:
    """One incarnation: its id and the first offset it wrote."""

    id: str
    base: int


def new_id() -> str:
    """A fresh, globally unique incarnation id (32 lowercase hex chars)."""
    return uuid.uuid4().hex


def is_valid_id(value: object) -> bool:
    """``value`` has the shape of an incarnation id (what the wire accepts)."""
    return isinstance(value, str) and _ID_RE.fullmatch(value) is not None


def check_entries(entries: Sequence[IncarnationEntry]) -> None:
    """Raise IncarnationError unless ``entries`` is a valid history: at least one entry, valid
    distinct ids, bases >= 0 and non-decreasing (two truncations at one offset give equal bases)."""
    if not entries:
        raise IncarnationError("an incarnation history needs at least one entry")
    seen: set[str] = set()
    prev = 0
    for i, e in enumerate(entries):
        if not is_valid_id(e.id):
            raise IncarnationError(f"history[{i}]: bad incarnation id {e.id!r}")
        if e.id in seen:
            raise IncarnationError(f"history[{i}]: incarnation {e.id} appears twice")
        if isinstance(e.base, bool) or not isinstance(e.base, int) or e.base < prev:
            raise IncarnationError(f"history[{i}]: base {e.base!r} is negative or below the previous one")
        seen.add(e.id)
        prev = e.base


def diverged_at(entries: Sequence[IncarnationEntry], incarnation: str) -> int | None:
    """The first offset from which a log with history ``entries`` no longer holds the records of
    ``incarnation``: the base of the entry that follows it; 0 when the id is not in the history at
    all (nothing of it can be trusted); None when it is the current incarnation (no divergence)."""
    for i, e in enumerate(entries):
        if e.id == incarnation:
            return entries[i + 1].base if i + 1 < len(entries) else None
    return 0


def entries_to_json(entries: Sequence[IncarnationEntry]) -> list[dict[str, Any]]:
    """The wire and file form: ``[{"id": ..., "base": ...}, ...]``."""
    return [{"id": e.id, "base": e.base} for e in entries]


def entries_from_json(raw: object) -> list[IncarnationEntry]:
    """Parse and check the wire and file form; IncarnationError names what is wrong."""
    if not isinstance(raw, list):
        raise IncarnationError(f"history must be a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"id", "base"}:
            raise IncarnationError(f"history[{i}]: expected {{'id', 'base'}}, got {item!r}")
        out.append(IncarnationEntry(item["id"], item["base"]))
    check_entries(out)
    return out
