"""The link rule of the claim chain (claim_chain.link_problem), pure: every chain the protocol can
write (files after the previous end, new incarnations and replay ids restarting offsets, voids) has
no broken link, and each way a claim can be broken by hand (deleted so the next follows a gap,
overwritten by an older claim, by another slot's claim) is found at that claim."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.landing.claim_chain import ChainState, Claim, link_problem
from mqd.landing.layout import FileRange

INCS = ["a" * 32, "b" * 32, "c" * 32]


@st.composite
def chains(draw: st.DrawFn) -> list[Claim]:
    """A chain as commits and voids write it: each file starts after the head's end in the head's
    incarnation (maybe past a gap: a forward reset), or anywhere in another incarnation."""
    out: list[Claim] = []
    state = ChainState()
    for seq in range(draw(st.integers(1, 12))):
        if out and out[-1].range is not None and draw(st.integers(0, 5)) == 0:
            voided = out[-1]
            out.append(Claim(seq, "n", prev=state, state=voided.prev, voids=voided.seq))
            state = voided.prev
            continue
        inc = draw(st.sampled_from(INCS))
        if state.last_offset is None or inc != state.incarnation:
            first = draw(st.integers(0, 50))
        else:
            first = state.last_offset + 1 + draw(st.sampled_from([0, 0, 0, 7]))
        last = first + draw(st.integers(0, 20))
        rng = FileRange(
            f"topic=t/dt=2026-01-01/hour=00/{seq}.parquet",
            "t",
            0,
            first,
            last,
            last - first + 1,
            0,
            0,
            incarnation=inc,
        )
        new = ChainState(last, inc, state.files + 1, None)
        out.append(Claim(seq, "n", prev=state, state=new, range=rng))
        state = new
    return out


def problems(claims: list[Claim], at: dict[int, Claim] | None = None) -> list[int]:
    """Slots whose claim (``at`` overrides what a slot holds) is not a link of the chain."""
    slots = {c.seq: c for c in claims} | (at or {})
    out = []
    before_state, before = ChainState(), None
    for seq in sorted(slots):
        c = slots[seq]
        if link_problem("t", 0, seq, c, before_state, before) is not None:
            out.append(seq)
        before_state, before = c.state, c
    return out


@settings(max_examples=300)
@given(chains())
def test_every_chain_the_protocol_writes_is_whole(claims: list[Claim]) -> None:
    """No false alarm: files in order, incarnation changes, offset gaps and voids all link."""
    assert problems(claims) == []


@settings(max_examples=300)
@given(chains(), st.data())
def test_a_claim_overwritten_by_an_older_one_is_found_there(claims: list[Claim], data: st.DataObject) -> None:
    """Slot k holding claim j < k (a valid claim of the wrong slot): the break is found at k."""
    if len(claims) < 2:
        return
    k = data.draw(st.integers(1, len(claims) - 1))
    j = data.draw(st.integers(0, k - 1))
    assert problems(claims, {k: claims[j]})[:1] == [k]


@settings(max_examples=300)
@given(chains(), st.data())
def test_a_deleted_claim_breaks_the_link_of_the_next(claims: list[Claim], data: st.DataObject) -> None:
    """Claim k deleted, claim k+1 read right after k-1 (its slot number checked apart): its link
    never holds, since every claim moves the state's file count (a file +1, a void -1)."""
    if len(claims) < 3:
        return
    k = data.draw(st.integers(1, len(claims) - 2))
    nxt = claims[k + 1]
    prev = claims[k - 1]
    assert link_problem("t", 0, k + 1, nxt, prev.state, prev) is not None


def test_a_claim_of_another_slot_or_partition_and_a_backwards_range_are_named() -> None:
    """The seq inside the claim, the partition of its file, and offsets going back in one
    incarnation are each a broken link, with words an operator can act on."""
    rng = FileRange("p", "t", 0, 0, 9, 10, 0, 0, incarnation=INCS[0])
    c0 = Claim(0, "n", ChainState(), ChainState(9, INCS[0], 1), range=rng)
    assert link_problem("t", 0, 0, c0, ChainState()) is None
    assert "says it is claim 0" in (link_problem("t", 0, 1, c0, ChainState()) or "")
    assert "of t/0" in (link_problem("t", 1, 0, c0, ChainState()) or "")
    back = FileRange("p2", "t", 0, 5, 12, 8, 0, 0, incarnation=INCS[0])
    c1 = Claim(1, "n", c0.state, ChainState(12, INCS[0], 2), range=back)
    assert "at or before the previous end 9" in (link_problem("t", 0, 1, c1, c0.state, c0) or "")
    other = FileRange("p3", "t", 0, 5, 12, 8, 0, 0, incarnation=INCS[1])  # a replay id: offsets restart
    c2 = Claim(1, "n", c0.state, ChainState(12, INCS[1], 2), range=other)
    assert link_problem("t", 0, 1, c2, c0.state, c0) is None
