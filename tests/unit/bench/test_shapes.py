"""The benchmark's own logic (bench/common.py, bench/shapes.py): how a shape lays its records out,
how a run is checked for exactness, and how interleaved runs are summarised. A benchmark that
miscounts would report a wrong table, so these are checked like the daemon's code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support import REPO_ROOT


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # bench is a package of the project root, not installed
    from bench import alt_consumer, common, shapes

    yield common, shapes, alt_consumer


def test_hot_layout_puts_the_share_on_partition_zero(bench: tuple[ModuleType, ...]) -> None:
    """A hot workload sends its share of the chunks to partition 0 and the rest round-robin over the
    others; every record is laid out once; without ``hot`` the layout is round-robin."""
    common = bench[0]
    hot = common.Workload(6_000_000, 100, 12, 1000, hot=0.9)
    counts = hot.per_partition()
    assert sum(counts) == 6_000_000
    assert counts[0] == 5_400_000
    assert max(counts[1:]) - min(counts[1:]) <= 1000  # the rest spread evenly (whole chunks)
    even = common.Workload(12_345, 100, 4, 1000).per_partition()
    assert even == [3345, 3000, 3000, 3000]  # 13 chunks: the 13th (345) back on partition 0


def _write(alt_consumer: ModuleType, root: Path, partition: int, first: int, count: int) -> None:
    writer = alt_consumer.MicroBatchWriter(
        root, "events", max_records=10**9, max_bytes=2**40, max_age=1e9, workers=1
    )
    try:
        offsets = np.arange(first, first + count, dtype=np.int64)
        writer.add(
            partition,
            alt_consumer.record_batch(
                offsets, np.zeros(count, dtype=np.int64), [None] * count, [b"x"] * count
            ),
        )
        writer.flush()
    finally:
        writer.close()


def test_check_exact_finds_gaps_overlaps_and_shortfalls(
    bench: tuple[ModuleType, ...], tmp_path: Path
) -> None:
    """Landed files (mqd's layout, range metadata) pass only when they hold offsets 0..n-1 of each
    partition exactly once: a missing file is a gap, a file twice over a range an overlap, a
    partition short of its records a shortfall, a partition nobody expected is named."""
    common, _, alt_consumer = bench
    _write(alt_consumer, tmp_path / "ok", 0, 0, 10)
    _write(alt_consumer, tmp_path / "ok", 0, 10, 5)
    _write(alt_consumer, tmp_path / "ok", 1, 0, 7)
    ok = sorted((tmp_path / "ok").glob("part-*.parquet"))
    assert common.check_exact(ok, [15, 7]) is None
    assert "expected 0..16" in common.check_exact(ok, [17, 7])
    assert "unexpected partitions [1]" in common.check_exact(ok, [15])

    _write(alt_consumer, tmp_path / "gap", 0, 0, 10)
    _write(alt_consumer, tmp_path / "gap", 0, 11, 4)
    assert "gap" in common.check_exact(sorted((tmp_path / "gap").glob("part-*.parquet")), [15])

    _write(alt_consumer, tmp_path / "dup", 0, 0, 10)
    _write(alt_consumer, tmp_path / "dup", 0, 5, 10)
    assert "overlap" in common.check_exact(sorted((tmp_path / "dup").glob("part-*.parquet")), [15])


def _run(name: str, rnd: int, whole: int, steady: int, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "round": rnd,
        "exact": True,
        "records_per_s_whole_process": whole,
        "records_per_s": steady,
        "cpu_s": 2.0,
        "broker_cpu_s": 1.0,
        "startup_seconds": 0.5,
        "peak_rss_mb": 100.0,
        "load": 1.0,
        "burst_share": 1.0,
        "median_file_mb": 30.0,
        "files": 10,
        **kw,
    }


def test_summary_pairs_ratios_by_round(bench: tuple[ModuleType, ...]) -> None:
    """Ratios are taken round by round (the runs that shared a moment of machine load), their median
    reported with min and max; the best alternative is the one with the highest median; a failed
    run is counted but not measured."""
    _, shapes, _ = bench
    runs = [
        _run("mqd", 0, 300, 400),
        _run("alt", 0, 100, 100),
        _run("mqd", 1, 150, 200),  # a slow round for everyone
        _run("alt", 1, 50, 50),
        _run("mqd", 2, 280, 380),
        _run("alt", 2, 140, 150),
        {"name": "other", "round": 0, "error": "exit 1"},
    ]
    s = shapes.summarize(runs, 2_000_000, {"records_per_s": 560})
    assert s["alt"]["paired_ratio"] == {"median": 3.0, "min": 2.0, "max": 3.0}
    assert s["mqd"]["whole"] == {"median": 280.0, "min": 150.0, "max": 300.0}
    assert s["mqd"]["cpu_per_m"]["median"] == 1.0 and s["mqd"]["cpu_per_m_with_brokers"]["median"] == 1.5
    assert s["best_alternative"] == "alt"
    assert s["mqd_share_of_ceiling"] == 0.5
    assert s["other"]["runs"] == 1 and s["other"]["failed"] == 1 and s["other"]["whole"] is None


def test_record_batch_is_the_landing_schema(bench: tuple[ModuleType, ...]) -> None:
    """The alternatives' batches have mqd's record schema, so their files are mqd's files."""
    _, _, alt_consumer = bench
    from mqd.records import RECORD_SCHEMA

    b = alt_consumer.record_batch(
        np.arange(3, dtype=np.int64), np.zeros(3, dtype=np.int64), [None] * 3, [b"a"] * 3
    )
    assert b.schema == RECORD_SCHEMA and b.num_rows == 3
    assert isinstance(b, pa.RecordBatch)


def test_busy_seconds_leave_idle_and_iowait_out(bench: tuple[ModuleType, ...]) -> None:
    """The machine's busy time is every field of psutil's system CPU times but idle and iowait
    (guest is inside user), and the live figure only grows."""
    from types import SimpleNamespace

    common = bench[0]
    times = SimpleNamespace(
        user=1.0, nice=0.2, system=0.3, idle=50.0, iowait=7.0, irq=0.04, softirq=0.06, steal=0.4
    )
    assert common.busy_seconds(times) == pytest.approx(1.0 + 0.2 + 0.3 + 0.04 + 0.06 + 0.4)
    first = common.machine_busy_seconds()
    assert 0 < first <= common.machine_busy_seconds()


def test_outside_share_is_what_neither_the_run_nor_its_brokers_used(bench: tuple[ModuleType, ...]) -> None:
    """The outside share of a run: the machine's busy CPU over the run less the process's and its
    brokers', over the run's capacity (wall x cores); never below 0 (the counters tick apart)."""
    common = bench[0]
    stats = common.ProcessStats(
        wall_s=2.0, cpu_s=1.5, peak_rss_mb=1.0, exit_code=0, started_at=0.0, ended_at=2.0, machine_busy_s=3.1
    )
    assert stats.outside_share(0.6, cores=2) == pytest.approx(0.25)
    assert stats.outside_share(2.0, cores=2) == 0.0


def test_a_watched_process_sees_a_busy_neighbour(bench: tuple[ModuleType, ...], tmp_path: Path) -> None:
    """Measured for real: while a neighbour spins, at least one core is busy all the time, so a
    process that only sleeps meanwhile shows at least that core as outside CPU (whatever else the
    machine runs adds to it, never takes from it)."""
    import subprocess
    import sys

    common = bench[0]
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = common.WatchedProcess(
            [sys.executable, "-c", "import time; time.sleep(1.0)"], log_path=tmp_path / "sleep.log"
        )
        proc.start()
        stats = proc.finish(30)
    finally:
        spin.kill()
        spin.wait()
    cores = common.os.cpu_count() or 1
    assert stats.machine_busy_s >= 0.8 * stats.wall_s
    assert stats.outside_share(0.0) >= 0.8 / cores


def test_a_runs_fetch_count_starts_from_zero_on_nodes_that_do_not_know_its_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before a run its client is unknown to every node: its count there is 0, not the node's
    total of every client's fetches (the shapes table printed -142 fetch requests for a run)."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import pipeline

    class Nodes:
        node_ids = ["a", "b", "old"]
        answers: dict[str, dict[str, Any]] = {
            "a": {"requests": {"fetch": 500}, "clients": {"other": {"fetch": 500}}},
            "b": {"requests": {"fetch": 700}, "clients": {"run-daemon": {"fetch": 40}, "x": {"fetch": 660}}},
            "old": {"requests": {"fetch": 9}},  # a node without per-client stats
        }

        def get_json(self, node: str, path: str) -> dict[str, Any]:
            assert path == "/v1/stats"
            return self.answers[node]

    assert pipeline.fetch_counts(Nodes(), "run-daemon") == {"a": 0, "b": 40, "old": 9}  # type: ignore[arg-type]
