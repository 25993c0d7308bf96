"""bench/kafka_to_table.py's own logic: the table's exactness check, the produce-to-queryable
computation and the paired summary. A benchmark that miscounts would report a wrong table, so these
are checked like the daemon's code (no timing here: the logic only)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import numpy as np
import pytest
from support import REPO_ROOT


@pytest.fixture
def k2t(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # bench is a package of the project root, not installed
    from bench import kafka_to_table

    yield kafka_to_table


def _rows(per_partition: list[int]) -> tuple[np.ndarray, np.ndarray]:
    parts = np.concatenate([np.full(n, p) for p, n in enumerate(per_partition)])
    offs = np.concatenate([np.arange(n) for n in per_partition])
    return parts, offs


def test_an_exact_table_passes_in_any_row_order(k2t: ModuleType) -> None:
    parts, offs = _rows([3, 0, 5])
    order = np.random.default_rng(1).permutation(len(offs))
    assert k2t.table_inexact(parts[order], offs[order], [3, 0, 5]) is None


def test_a_duplicate_with_a_missing_record_is_caught(k2t: ModuleType) -> None:
    """The row count alone is right when one record is lost and another doubled."""
    parts, offs = _rows([4, 4])
    offs[3] = 2  # partition 0: 0, 1, 2, 2
    assert "duplicate" in k2t.table_inexact(parts, offs, [4, 4])


def test_shortfall_gap_and_foreign_partitions_are_caught(k2t: ModuleType) -> None:
    parts, offs = _rows([4, 4])
    assert "rows" in k2t.table_inexact(parts[:-1], offs[:-1], [4, 4])
    shifted = offs.copy()
    shifted[parts == 1] += 1  # partition 1: 1..4, not 0..3
    assert "expected 0..3" in k2t.table_inexact(parts, shifted, [4, 4])
    foreign = parts.copy()
    foreign[parts == 1] = 7
    assert k2t.table_inexact(foreign, offs, [4, 4]) is not None


def test_latency_is_seen_time_minus_kafka_timestamp_over_every_record(k2t: ModuleType) -> None:
    """Each record counts once, from the poll that first saw its commit; the commit file's time is
    the second figure; a version that added no data (an empty batch, a compaction) counts nothing."""
    commits = [
        k2t.Commit(1, seen_ms=2_000.0, commit_ms=1_950.0, timestamps_ms=np.array([1_000.0, 1_500.0])),
        k2t.Commit(2, seen_ms=3_000.0, commit_ms=2_990.0, timestamps_ms=np.empty(0)),
        k2t.Commit(3, seen_ms=4_000.0, commit_ms=3_900.0, timestamps_ms=np.array([3_800.0] * 98)),
    ]
    out = k2t.latency_summary(commits, expected=100)
    assert out["records"] == 100 and out["commits"] == 2 and out["expected"] == 100
    assert out["queryable_p50_ms"] == 200.0
    assert out["queryable_max_ms"] == 1_000.0
    assert out["commit_p50_ms"] == 100.0
    assert out["commit_max_ms"] == 950.0
    # p99 of 100 values lies between the 99th and 100th smallest (numpy's linear interpolation)
    assert 500.0 <= out["queryable_p99_ms"] <= 1_000.0


def test_latency_without_records_reports_none(k2t: ModuleType) -> None:
    assert k2t.latency_summary([], expected=5) == {"records": 0, "commits": 0, "expected": 5}


def test_summary_pairs_rounds_and_leaves_failed_runs_out(k2t: ModuleType) -> None:
    def run(name: str, rnd: int, rate: int) -> dict[str, object]:
        return {
            "pipeline": name,
            "round": rnd,
            "records_per_s": rate,
            "wall_s": 1e6 / rate,
            "exact": True,
            "cpu_s_per_m": 1.0,
            "cpu_s_per_m_with_broker": 1.5,
            "peak_rss_mb": 100.0,
            "load": 1.0,
            "step_wall_s": {name: 1.0},
            "step_peak_rss_mb": {name: 100.0},
        }

    runs = [
        run("mqd", 0, 200),
        run("spark", 0, 100),
        run("mqd", 1, 300),
        run("spark", 1, 100),
        {"pipeline": "spark", "round": 2, "error": "exit 1"},
        run("mqd", 2, 900),  # no spark run to pair with
    ]
    s = k2t.summarize(runs)
    assert s["mqd"]["runs"] == 3 and s["spark"]["runs"] == 2
    assert s["ratio_mqd_to_spark"] == {"median": 2.5, "min": 2.0, "max": 3.0}
    assert s["mqd"]["records_per_s"]["median"] == 300
