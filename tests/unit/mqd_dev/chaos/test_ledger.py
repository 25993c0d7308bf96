"""The chaos end check's truth: the producer's ledger, and the payload-id check against a copy."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqd_dev.chaos.check import check_payloads, payload_partition
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.load import record_value
from mqd_dev.chaos.runner import ALL_KINDS, CATEGORIES, CLASSIC_KINDS, SAFETY_KINDS, expand_kinds


def _ledger(rows: list[tuple[int, int, int]], generation: int = 0) -> pa.Table:
    """(partition, offset, seq) per acknowledged record."""
    return pa.table(
        {
            "topic": pa.array(["t"] * len(rows), pa.string()),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "payload": pa.array([record_value(r[0], r[2]) for r in rows], pa.binary()),
            "generation": pa.array([generation] * len(rows), pa.int32()),
        }
    )


def _copy(rows: list[tuple[int, int, bytes]]) -> pa.Table:
    return pa.table(
        {
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
        }
    )


def test_ledger_round_trip_and_torn_last_line(tmp_path: Path) -> None:
    """What the load records comes back line for line, one row per record at consecutive offsets; a
    torn last line (the run killed mid-write) is ignored, not a parse error."""
    path = tmp_path / "ledger.tsv"
    ledger = Ledger(path)
    with pytest.raises(RuntimeError):
        ledger.record("t", 0, 0, [b"x"], 0)
    ledger.start()
    ledger.record("t", 1, 10, [record_value(1, 0), record_value(1, 1)], 0)
    ledger.record("t", 1, 0, [record_value(1, 2)], 1)  # a new generation reuses offset 0
    ledger.close()
    with open(path, "a") as fh:
        fh.write("t\t1\t3\tp00001-s00")
    t = read_ledger(path)
    assert t.column("offset").to_pylist() == [10, 11, 0]
    assert t.column("payload").to_pylist() == [record_value(1, i) for i in range(3)]
    assert t.column("generation").to_pylist() == [0, 0, 1]
    assert ledger.records == 3
    assert read_ledger(tmp_path / "missing.tsv").num_rows == 0


def test_payload_partition_parses_only_chaos_payloads() -> None:
    """A payload names its partition; anything else (a damaged or alien value) is no payload."""
    assert payload_partition(record_value(7, 123)) == 7
    assert payload_partition(b"p00007-s00000001x3") is None
    assert payload_partition(b"hello") is None
    assert payload_partition(record_value(7, 123)[:-1]) is None


def test_reused_offsets_do_not_confuse_the_payload_check() -> None:
    """Two incarnations reuse offsets 0..2 of partition 0: each acknowledged payload landed once at
    its own offset passes, whatever else sits at the same offsets; the old check by offset would
    call these duplicates and mismatches."""
    ledger = _ledger([(0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 0, 3), (0, 1, 4), (0, 2, 5)])
    copy = _copy([(0, o % 3, record_value(0, o)) for o in range(6)])
    res = check_payloads(ledger, copy)
    assert res.ok and res.lost == res.duplicates == res.moved == res.foreign == 0
    assert res.distinct == 6 and res.acknowledged == 6


def test_dropped_reused_offsets_are_lost() -> None:
    """The bug chaos must find: the new incarnation's records at reused offsets never landed."""
    ledger = _ledger([(0, 0, 0), (0, 1, 1), (0, 0, 2), (0, 1, 3)])
    copy = _copy([(0, 0, record_value(0, 0)), (0, 1, record_value(0, 1))])
    res = check_payloads(ledger, copy)
    assert not res.ok and res.lost == 2
    assert "partition 0: 2 acknowledged records lost, offsets 0..1" in res.examples


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 30),
    drop=st.sets(st.integers(0, 29)),
    dup=st.sets(st.integers(0, 29)),
    move=st.sets(st.integers(0, 29)),
    unacked=st.integers(0, 3),
    foreign=st.integers(0, 3),
)
def test_payload_check_counts_every_kind_of_difference(
    n: int, drop: set[int], dup: set[int], move: set[int], unacked: int, foreign: int
) -> None:
    """check_payloads reports exactly the lost, duplicated, moved, unacknowledged and foreign rows of
    a copy, in any row order."""
    ledger = _ledger([(0, o, o) for o in range(n)])
    rows: list[tuple[int, int, bytes]] = []
    kept = [o for o in range(n) if o not in drop]
    for o in kept:
        rows.append((0, o + 1000 if o in move else o, record_value(0, o)))
        if o in dup:
            rows.append((0, o, record_value(0, o)))
    rows.extend((0, 500 + i, record_value(0, 10_000 + i)) for i in range(unacked))  # written, not acked
    rows.extend((0, 600 + i, b"garbage%d" % i) for i in range(foreign))
    res = check_payloads(ledger, _copy(rows[::-1]))
    assert res.lost == n - len(kept)
    assert res.duplicates == len([o for o in kept if o in dup])
    # a duplicate of a moved record sits at the acked offset, the first copy elsewhere: moved either way
    assert res.moved == len([o for o in kept if o in move])
    assert res.unacknowledged == unacked
    assert res.foreign == foreign
    assert res.distinct == len(kept) + unacked
    assert res.ok == (res.lost == res.duplicates == res.moved == foreign == 0)


def test_records_acknowledged_before_the_start_position_are_not_expected() -> None:
    """Generation -1 (acked before the daemons' first start with consume_from = "last") may be
    missing from the landing; if one lands anyway it counts once, and twice is a duplicate."""
    before = _ledger([(0, 0, 0), (0, 1, 1)], generation=-1)
    after = _ledger([(0, 2, 2)])
    ledger = pa.concat_tables([before, after])
    res = check_payloads(ledger, _copy([(0, 2, record_value(0, 2))]))
    assert res.ok and res.acknowledged == 1 and res.lost == 0
    twice = _copy([(0, 1, record_value(0, 1)), (0, 1, record_value(0, 1)), (0, 2, record_value(0, 2))])
    assert check_payloads(ledger, twice).duplicates == 1


def test_a_record_in_the_wrong_partition_is_foreign() -> None:
    """A payload of partition 1 found in partition 0's rows is not counted as partition 0's."""
    res = check_payloads(_ledger([(1, 0, 0)]), _copy([(0, 0, record_value(1, 0))]))
    assert res.foreign == 1 and res.lost == 1 and not res.ok


def test_kind_groups_expand_to_known_kinds() -> None:
    """--kinds takes names, categories and the classic/safety/all groups, in order and without
    repeats; the groups partition the kinds and the safety kinds are issue 12's six."""
    assert expand_kinds("all") == ALL_KINDS
    assert set(CLASSIC_KINDS) | set(SAFETY_KINDS) == set(ALL_KINDS)
    assert not set(CLASSIC_KINDS) & set(SAFETY_KINDS)
    assert expand_kinds("safety") == SAFETY_KINDS and len(SAFETY_KINDS) == 6
    assert expand_kinds("master_dir_loss,broker") == (
        "master_dir_loss",
        *[k for k in CATEGORIES["broker"] if k != "master_dir_loss"],
    )
    assert expand_kinds("meteor,") == ("meteor",)  # refused later by ChaosOptions.validate, by name
    assert expand_kinds("") == ()
