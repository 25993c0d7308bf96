"""The landing's optional leader epoch (FileRange, the claim chain's ChainState): written only when
a source has one, absent in older records, which still read (as None)."""

from __future__ import annotations

from mqd.landing.claim_chain import ChainState, Claim
from mqd.landing.layout import FileRange

INC = "0" * 31 + "a"


def rng(epoch: int | None) -> FileRange:
    return FileRange("p", "t", 0, 0, 9, 10, 1, 2, incarnation=INC, leader_epoch=epoch)


def test_a_range_without_an_epoch_keeps_its_old_shape_and_old_records_read() -> None:
    """No epoch: the JSON is the shape older daemons wrote; a record without the key reads as None."""
    d = rng(None).to_json()
    assert "leader_epoch" not in d
    assert FileRange.from_json(d) == rng(None)


def test_an_epoch_round_trips_through_the_range_the_chain_state_and_a_claim() -> None:
    """An epoch is kept by FileRange, ChainState and a Claim serialised and read back."""
    assert FileRange.from_json(rng(7).to_json()) == rng(7)
    st = ChainState(9, INC, 1, None, 7)
    assert ChainState.from_json(st.to_json()) == st
    assert "leader_epoch" not in ChainState(9, INC, 1).to_json()
    assert ChainState.from_json({"last_offset": 9, "incarnation": INC, "files": 1}).leader_epoch is None
    claim = Claim(1, "n", ChainState(), st, rng(7), "staged", created="x")
    assert Claim.from_bytes(claim.to_bytes(), "here") == claim
