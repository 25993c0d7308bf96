"""The incarnation history of one partition log: which records an offset names, over the log's life.

Offsets are unique only within one incarnation of a log: when a log is created empty, recreated (its
folder gone) or truncated, the offsets it hands out next may name records other than the ones it
served before. Each such event begins a new incarnation, a globally unique id (``uuid4().hex``, not a
counter a rebuilt cluster would repeat). The history lists ``(id, base)`` entries oldest first, like
Kafka's leader-epoch checkpoint: ``base`` is the first offset the incarnation wrote, the last entry
is the current one. A slave adopts its master's history (a leader change is not a new incarnation).

The history lives in ``incarnation.json`` in the partition folder, written atomically and fsynced
(:func:`mqd.fsutil.atomic_write`). A truncation writes the new history *before* it cuts the log: a
crash in between leaves the new id over records that may still be the old ones, which a consumer
sees as a change (counted, landed again), never the old id over other records (silent loss).

A consumer that followed a log through several incarnations names, beside the one its position
belongs to, the ones it fetched before (its *lineage*: each id with the first offset it fetched under
the next one, mqd/consumer/incarnation_lineage.py). A log that lost the newest of them (a master
restarted uncleanly began one, then lost its data dir before its slave learnt it, and took its
records back from that slave) still knows an older one, and so where the consumer's records stop
being this log's: :meth:`IncarnationHistory.diverged_for`. Without the lineage such a consumer could
only start over at 0 and land every record again under the new id.

The rules are pure functions over the entry list (:func:`diverged_at`), so they are unit-tested
without a log; :class:`IncarnationHistory` adds the file.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqd.errors import MqdError
from mqd.fsutil import atomic_write

HISTORY_FILE = "incarnation.json"
_FORMAT = 1
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


class IncarnationHistory:
    """The durable history of one partition log (``<partition folder>/incarnation.json``)."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / HISTORY_FILE
        self._entries: list[IncarnationEntry] = []
        # ids cut away by a truncation below their base -> the offset they diverged at
        self._retired: dict[str, int] = {}

    @property
    def entries(self) -> list[IncarnationEntry]:
        """Oldest first; the last one is the current incarnation (a copy)."""
        return list(self._entries)

    @property
    def current(self) -> str:
        return self._entries[-1].id

    @property
    def current_base(self) -> int:
        return self._entries[-1].base

    def load(self) -> bool:
        """Read the file; False when there is none (a new log, or one written before histories)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise IncarnationError(f"{self.path}: not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise IncarnationError(f"{self.path}: not an incarnation history of format {_FORMAT}")
        try:
            self._entries = entries_from_json(doc.get("history"))
            retired = doc.get("retired", [])
            if not isinstance(retired, list):
                raise IncarnationError("retired must be a list")
            self._retired = {e.id: e.base for e in (IncarnationEntry(r["id"], r["base"]) for r in retired)}
        except (KeyError, TypeError) as exc:
            raise IncarnationError(f"{self.path}: malformed retired entries: {exc}") from exc
        except IncarnationError as exc:
            raise IncarnationError(f"{self.path}: {exc}") from exc
        return True

    def diverged_at(self, incarnation: str) -> int | None:
        """:func:`diverged_at` over this history; a retired id diverged where it was cut away."""
        at = self._retired.get(incarnation)
        return at if at is not None else diverged_at(self._entries, incarnation)

    def knows(self, incarnation: str) -> bool:
        """``incarnation`` is in this history (current, earlier or retired)."""
        return incarnation in self._retired or any(e.id == incarnation for e in self._entries)

    def diverged_for(self, incarnation: str, lineage: Sequence[tuple[str, int]] = ()) -> int | None:
        """:meth:`diverged_at` for a consumer whose position belongs to ``incarnation`` and which
        fetched under the ``lineage`` ids before it (oldest first, each with the first offset it
        fetched under the next one). When this history does not hold ``incarnation``, the newest
        lineage id it holds says how far the consumer's records are this log's: up to where this
        log stops holding that id, and no further than the consumer read under it."""
        if self.knows(incarnation):
            return self.diverged_at(incarnation)
        for earlier, end in reversed(lineage):
            if self.knows(earlier):
                at = self.diverged_at(earlier)
                return end if at is None else min(at, end)
        return 0

    def begin_new(self, base: int) -> str:
        """Start a new incarnation whose first offset is ``base`` (durable on return); its id.

        A cut below the current base (the entries from there on wrote nothing that is left) retires
        those entries: their divergence point is ``base`` from now on."""
        if base < 0:
            raise IncarnationError(f"negative base {base}")
        kept = [e for e in self._entries if e.base <= base]
        retired = dict(self._retired)
        for e in self._entries[len(kept) :]:
            retired[e.id] = base
        self._save([*kept, IncarnationEntry(new_id(), base)], retired)
        return self.current

    def adopt(self, entries: Sequence[IncarnationEntry]) -> None:
        """Take a master's history as ours (durable on return); a no-op when it is already ours."""
        entries = list(entries)
        check_entries(entries)
        if entries != self._entries:
            # our own ids that the master's history lacks: a consumer naming one starts over at 0
            self._save(entries, {})

    def _save(self, entries: list[IncarnationEntry], retired: dict[str, int]) -> None:
        check_entries(entries)
        doc = {
            "format": _FORMAT,
            "history": entries_to_json(entries),
            "retired": [{"id": k, "base": v} for k, v in retired.items()],
        }
        atomic_write(self.path, json.dumps(doc, separators=(",", ":")).encode())
        self._entries, self._retired = entries, retired


__all__ = [
    "HISTORY_FILE",
    "MAX_LINEAGE",
    "IncarnationEntry",
    "IncarnationError",
    "IncarnationHistory",
    "check_entries",
    "diverged_at",
    "entries_from_json",
    "entries_to_json",
    "is_valid_id",
    "new_id",
]
