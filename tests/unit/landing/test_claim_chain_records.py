"""The claim chain's records and pure rules: a claim survives its JSON round trip, a void record
removes exactly the claim it names from the manifest, an unreadable claim is LandingCorrupt, and
``s3://`` URIs split into bucket and prefix; the commit condition row by row."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.landing.claim_chain import ChainState, Claim, _live_ranges, follows
from mqd.landing.errors import LandingCorrupt
from mqd.landing.layout import FileRange
from mqd.landing.s3_objects import parse_s3_uri

offsets = st.integers(min_value=0, max_value=2**62)


def rng(first: int, last: int) -> FileRange:
    path = f"topic=t/x/part-00000-{first:020d}.parquet"
    return FileRange(path, "t", 0, first, last, last - first + 1, 1, 2)


@given(first=offsets, span=st.integers(0, 10**6), files=st.integers(0, 10**9), seq=st.integers(0, 10**12))
def test_claim_round_trip(first: int, span: int, files: int, seq: int) -> None:
    """Every field of a file claim comes back from its bytes as written."""
    c = Claim(
        seq=seq,
        nonce="ab" * 16,
        prev=ChainState(first - 1 if first else None, None, files, None),
        state=ChainState(first + span, "c" * 32, files + 1, 5),
        range=rng(first, first + span),
        staged="_staging/t/00000/x.parquet",
        created="2026-01-01T00:00:00.000+00:00",
    )
    assert Claim.from_bytes(c.to_bytes(), "k") == c


def test_a_void_record_removes_only_the_claim_it_names() -> None:
    """Claims 0 and 1 are files, 2 voids 1, 3 is the range landed again: the manifest is 0 and 3."""
    s = ChainState()
    chain = [
        Claim(0, "n0", s, s, rng(0, 4), "a"),
        Claim(1, "n1", s, s, rng(5, 9), "b"),
        Claim(2, "n2", s, s, voids=1),
        Claim(3, "n3", s, s, rng(5, 7), "c"),
    ]
    assert sorted(_live_ranges(chain)) == [0, 3]


@pytest.mark.parametrize("data", [b"", b"{}", b'{"version": 9}', b"not json", b'{"version": 1, "seq": "x"}'])
def test_an_unreadable_claim_is_corrupt(data: bytes) -> None:
    """Anything that is not a claim of this version names its key in a LandingCorrupt."""
    with pytest.raises(LandingCorrupt, match="_log/t/00000/claims/1"):
        Claim.from_bytes(data, "_log/t/00000/claims/1")


def test_s3_uri() -> None:
    """Bucket and prefix (no trailing slash; may be empty); anything else is refused."""
    assert parse_s3_uri("s3://b/land/ing/") == ("b", "land/ing")
    assert parse_s3_uri("s3://b") == ("b", "")
    for bad in ("s3:///x", "file:///x", "b/x"):
        with pytest.raises(ValueError):
            parse_s3_uri(bad)


OLD, NEW = "a" * 32, "b" * 32


@pytest.mark.parametrize(
    ("head", "first", "inc", "expected", "ok"),
    [
        ((None, None), 0, NEW, (None, None), True),  # empty, expected empty
        ((None, None), 5, NEW, (9, OLD), False),  # emptied by a void under a publisher's feet
        ((9, OLD), 10, OLD, (9, OLD), True),  # follows in one incarnation
        ((9, OLD), 15, OLD, (9, OLD), True),  # a gap (offsets gone from the source) still lands
        ((9, OLD), 5, OLD, (9, OLD), False),  # a replay inside one incarnation
        ((9, OLD), 4, NEW, (9, OLD), True),  # a new log reuses offsets: new records
        ((9, NEW), 10, OLD, (9, OLD), False),  # a stale owner on the old incarnation
        ((9, None), 5, NEW, (9, None), False),  # unknown landed incarnation: no reuse assumed
        ((9, None), 10, NEW, (9, None), True),
        ((9, OLD), 10, OLD, (7, OLD), False),  # a stale expected end
    ],
)
def test_the_commit_condition(
    head: tuple[int | None, str | None],
    first: int,
    inc: str,
    expected: tuple[int | None, str | None],
    ok: bool,
) -> None:
    """follows(): the head check of the claim chain, one row per case."""
    st = ChainState(last_offset=head[0], incarnation=head[1])
    assert follows(st, first, inc, expected[0], expected[1]) is ok
