"""The incarnation history rules (mqd/broker/incarnation.py): divergence points, new entries,
adoption, retired ids and the file, without a log.

Proves the wire contract's ``diverged_at``: the base of the entry after the named id, 0 for an id
the history does not hold, None for the current one; that a cut below the current base retires the
entries it removes at the cut offset; that the file round-trips and a damaged one is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.broker.incarnation import HISTORY_FILE, IncarnationHistory
from mqd.wire.incarnation import (
    IncarnationEntry,
    IncarnationError,
    check_entries,
    diverged_at,
    entries_from_json,
    entries_to_json,
    is_valid_id,
    new_id,
)

A, B, C = "a" * 32, "b" * 32, "c" * 32


def test_diverged_at_table() -> None:
    """An earlier id diverged at the next entry's base; the current one did not; an unknown one at 0."""
    history = [IncarnationEntry(A, 0), IncarnationEntry(B, 100), IncarnationEntry(C, 250)]
    assert diverged_at(history, A) == 100
    assert diverged_at(history, B) == 250
    assert diverged_at(history, C) is None
    assert diverged_at(history, "d" * 32) == 0


def test_ids_are_fresh_and_well_formed() -> None:
    """new_id gives 32 lowercase hex chars, never twice; is_valid_id accepts exactly that shape."""
    ids = {new_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(is_valid_id(i) for i in ids)
    for bad in ("A" * 32, "a" * 31, "a" * 33, "g" * 32, 12, None, "", " " + "a" * 31):
        assert not is_valid_id(bad)


@pytest.mark.parametrize(
    "entries",
    [
        [],
        [IncarnationEntry("x", 0)],
        [IncarnationEntry(A, -1)],
        [IncarnationEntry(A, 5), IncarnationEntry(B, 4)],
        [IncarnationEntry(A, 0), IncarnationEntry(A, 3)],
        [IncarnationEntry(A, True)],
    ],
)
def test_check_entries_refuses_broken_histories(entries: list[IncarnationEntry]) -> None:
    """Empty, bad ids, negative or decreasing bases, a repeated id: all refused."""
    with pytest.raises(IncarnationError):
        check_entries(entries)


def test_wire_form_round_trips_and_rejects_extra_keys() -> None:
    """entries_to_json / entries_from_json are inverse; unexpected shapes are refused."""
    history = [IncarnationEntry(A, 0), IncarnationEntry(B, 7)]
    assert entries_from_json(entries_to_json(history)) == history
    for raw in ({"id": A}, [{"id": A, "base": 0, "x": 1}], [["a", 0]], "[]"):
        with pytest.raises(IncarnationError):
            entries_from_json(raw)


def test_begin_new_appends_and_persists(tmp_path: Path) -> None:
    """begin_new adds an entry at its base, durable: a reload sees the same history."""
    h = IncarnationHistory(tmp_path)
    assert not h.load()
    first = h.begin_new(0)
    second = h.begin_new(40)
    assert h.entries == [IncarnationEntry(first, 0), IncarnationEntry(second, 40)]
    assert h.current == second and h.diverged_at(first) == 40 and h.diverged_at(second) is None
    again = IncarnationHistory(tmp_path)
    assert again.load() and again.entries == h.entries


def test_cut_below_current_base_retires_entries(tmp_path: Path) -> None:
    """A cut at 50 of a history [(A,0), (B,100)] keeps A, retires B at 50 and adds C at 50."""
    h = IncarnationHistory(tmp_path)
    a = h.begin_new(0)
    b = h.begin_new(100)
    c = h.begin_new(50)
    assert [e.id for e in h.entries] == [a, c]
    assert h.diverged_at(a) == 50 and h.diverged_at(b) == 50 and h.diverged_at(c) is None
    assert h.knows(b)
    again = IncarnationHistory(tmp_path)
    again.load()
    assert again.diverged_at(b) == 50


def test_adopt_replaces_history(tmp_path: Path) -> None:
    """A slave adopting its master's history takes it whole; its own ids are forgotten (0)."""
    h = IncarnationHistory(tmp_path)
    own = h.begin_new(0)
    master = [IncarnationEntry(A, 0), IncarnationEntry(B, 9)]
    h.adopt(master)
    assert h.entries == master and h.current == B
    assert h.diverged_at(own) == 0 and not h.knows(own)
    with pytest.raises(IncarnationError):
        h.adopt([])


@pytest.mark.parametrize("content", [b"not json", b'{"format": 2, "history": []}', b'{"format": 1}'])
def test_damaged_file_is_refused(tmp_path: Path, content: bytes) -> None:
    """A history file that does not parse is an error naming the file, never a silent fresh start."""
    (tmp_path / HISTORY_FILE).write_bytes(content)
    with pytest.raises(IncarnationError, match=HISTORY_FILE):
        IncarnationHistory(tmp_path).load()


# each example writes and fsyncs a history file per cut: its time is the disk's, not the rule's
@settings(deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=12))
def test_any_sequence_of_cuts_keeps_the_rules(cuts: list[int]) -> None:
    """For any sequence of new incarnations (cuts anywhere): the history stays valid, every id ever
    made is known, the current one has no divergence and every other id's divergence point is at
    most the base of the entry made after it."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        h = IncarnationHistory(Path(d))
        made: list[tuple[str, int]] = []
        for base in cuts:
            made.append((h.begin_new(base), base))
        check_entries(h.entries)
        assert h.diverged_at(h.current) is None
        for i, (ident, _) in enumerate(made[:-1]):
            assert h.knows(ident)
            at = h.diverged_at(ident)
            assert at is not None and at <= made[i + 1][1]
