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

The rules are pure functions over the entry list (:func:`mqd.wire.incarnation.diverged_at`, with the
entry type the wire carries), so they are unit-tested without a log; :class:`IncarnationHistory` adds
the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from mqd.fsutil import atomic_write
from mqd.wire.incarnation import (
    IncarnationEntry,
    IncarnationError,
    check_entries,
    diverged_at,
    entries_from_json,
    entries_to_json,
    new_id,
)

HISTORY_FILE = "incarnation.json"
_FORMAT = 1


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


__all__ = ["HISTORY_FILE", "IncarnationHistory"]
