"""The incarnation lineage (mqd/consumer/incarnation_lineage.py) and the broker's answer to it
(``IncarnationHistory.diverged_for``), without a log.

Proves that a log which never held the consumer's incarnation but holds an older one the consumer
fetched under answers where the consumer's records really stop being its own (chaos seed 587328:
a master that began an incarnation after an unclean restart, then lost its data dir before its
slave learnt it, answered 0 and the whole log landed twice); that without such an id the answer is
still 0; and that the consumer's lineage only ever says what it fetched under which id.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.broker.incarnation import IncarnationHistory
from mqd.consumer.incarnation_lineage import MAX_LINEAGE, after_change
from mqd.wire.incarnation import IncarnationEntry

A, B, C, D = "a" * 32, "b" * 32, "c" * 32, "d" * 32


def history(tmp_path: Path, *entries: tuple[str, int]) -> IncarnationHistory:
    h = IncarnationHistory(tmp_path)
    h.adopt([IncarnationEntry(i, base) for i, base in entries])
    return h


def test_a_log_that_lost_the_newest_id_answers_from_the_one_before(tmp_path: Path) -> None:
    """The chaos case: the consumer fetched A up to 1840, then B (begun at an unclean restart);
    the master lost B with its data dir and took A back from its slave as C at 1840. Asked for B,
    the log answers 1840 with the lineage, 0 without it."""
    h = history(tmp_path, (A, 0), (C, 1840))
    assert h.diverged_for(B, ((A, 1840),)) == 1840
    assert h.diverged_for(B) == 0


def test_the_lineage_answer_is_the_smaller_of_the_log_and_the_consumer(tmp_path: Path) -> None:
    """The consumer read A only up to its entry's end; the log holds A only up to C's base; A
    being current, the end alone counts; the newest known id wins; no known id gives 0."""
    h = history(tmp_path, (A, 0), (C, 1840))
    assert h.diverged_for(B, ((A, 1000),)) == 1000
    assert h.diverged_for(B, ((A, 5000),)) == 1840
    (tmp_path / "x").mkdir()
    assert history(tmp_path / "x", (A, 0)).diverged_for(B, ((A, 700),)) == 700
    assert h.diverged_for(B, ((D, 50), (A, 900))) == 900
    assert h.diverged_for(B, ((A, 900), (D, 950))) == 900
    assert h.diverged_for(B, ((D, 900),)) == 0


def test_a_known_id_ignores_the_lineage(tmp_path: Path) -> None:
    """The lineage never overrides what the history says of the named id itself."""
    h = history(tmp_path, (A, 0), (B, 100), (C, 250))
    assert h.diverged_for(B, ((A, 100),)) == 250
    assert h.diverged_for(C, ((A, 100), (B, 250))) is None


def test_after_change_records_where_the_consumer_left_each_id() -> None:
    """Following B at its position appends (A, position); a reuse cuts every earlier end at the
    divergence point and drops the ids it leaves covering nothing; 0 leaves nothing to name."""
    assert after_change((), A, 1840) == ((A, 1840),)
    assert after_change(((A, 1840),), B, 1860) == ((A, 1840), (B, 1860))
    assert after_change(((A, 1840), (B, 1860)), C, 1000) == ((A, 1000),)
    assert after_change(((A, 1840), (B, 1860)), C, 1850) == ((A, 1840), (B, 1850))
    assert after_change(((A, 1840),), B, 0) == ()
    assert after_change(((A, 1840),), None, 1900) == ((A, 1840),)


lineages = st.lists(st.tuples(st.sampled_from([A, B, C, D]), st.integers(0, 10_000)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(lineages, st.sampled_from([A, B, C, D, None]), st.integers(0, 10_000))
def test_after_change_never_claims_more_than_was_fetched(
    lineage: list[tuple[str, int]], old: str | None, boundary: int
) -> None:
    """From any lineage the rule made (contiguous, ends rising): no end lies past the boundary,
    every entry covers something, and it stays within what a fetch may carry."""
    made: tuple[tuple[str, int], ...] = ()
    for i, end in lineage:
        made = after_change(made, i, end)
    got = after_change(made, old, boundary)
    ends = [end for _, end in got]
    assert all(0 < end <= boundary for end in ends)
    assert ends == sorted(set(ends))
    assert len(got) <= MAX_LINEAGE
