"""The scrub's batch check (mqd/broker/scrub.py ``damaged_entries``), pure and on bytes in memory.

Proves: intact batches pass; one byte changed anywhere in any batch (header, base offset, CRC,
payload, padding) flags exactly that batch and no other; an index entry whose offset or extent does
not match the batch there is flagged too.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mqd.broker.scrub import damaged_entries
from mqd.wire import format as fmt


def _log(sizes: list[int]) -> tuple[bytearray, list[tuple[int, int, int, int]]]:
    """Batches of ``sizes`` records with offsets assigned as the broker does, and their entries."""
    buf = bytearray()
    entries = []
    offset = 0
    for i, n in enumerate(sizes):
        batch = bytearray(fmt.encode_batch([b"v%d-%d" % (i, j) for j in range(n)], keys=[b"k"] * n))
        fmt.set_base_offset(batch, 0, offset)
        entries.append((offset, offset + n - 1, len(buf), len(buf) + len(batch)))
        buf += batch
        offset += n
    return buf, entries


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=6),
    data=st.data(),
)
def test_one_changed_byte_flags_exactly_its_batch(sizes: list[int], data: st.DataObject) -> None:
    """Any single changed byte is found in the batch that holds it, and only there."""
    buf, entries = _log(sizes)
    assert damaged_entries(bytes(buf), 0, entries) == []
    at = data.draw(st.integers(min_value=0, max_value=len(buf) - 1), label="byte")
    buf[at] ^= data.draw(st.integers(min_value=1, max_value=255), label="xor")
    victim = next(k for k, (_, _, begin, end) in enumerate(entries) if begin <= at < end)
    assert damaged_entries(bytes(buf), 0, entries) == [victim]


def test_entries_that_do_not_match_the_bytes_are_flagged() -> None:
    """An entry naming another offset, or a shorter extent, than the intact batch there is damage;
    a chunk read from a later file position is checked relative to it."""
    buf, entries = _log([2, 3, 4])
    (o0, l0, b0, e0), (o1, l1, b1, e1), (o2, l2, b2, e2) = entries
    wrong = [(o0, l0, b0, e0), (o1 + 1, l1, b1, e1), (o2, l2, b2, e2 - 8)]
    assert damaged_entries(bytes(buf), 0, wrong) == [1, 2]
    assert damaged_entries(bytes(buf[b1:]), b1, entries[1:]) == []
