"""The memory gauge and the byte budget that counts it (mqd/consumer/memory_gauge.py).

The gauge reads a statm-format file; here a file the test writes stands in for /proc/self/statm,
so the readings are exact and each check says what the budget then leaves for fetching. The gauges
here read at every question (``read_every_s=0``) but where the reuse of a young reading is tested.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mqd import metrics
from mqd.consumer.budget import ByteBudget
from mqd.consumer.memory_gauge import MemoryGauge

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20


def set_rss(path: Path, nbytes: int) -> None:
    pages = nbytes // PAGE
    path.write_text(f"{pages * 3} {pages} 100 10 0 {pages} 0\n")


@pytest.fixture
def statm(tmp_path: Path) -> Path:
    path = tmp_path / "statm"
    set_rss(path, 100 * MIB)
    return path


def test_before_its_baseline_the_gauge_counts_nothing(statm: Path) -> None:
    """Until the daemon holds its code (the baseline), the budget is its charges alone."""
    gauge = MemoryGauge(str(statm), read_every_s=0)
    budget = ByteBudget(80 * MIB, held=True, gauge=gauge)
    set_rss(statm, 500 * MIB)
    assert budget.left() == 80 * MIB
    assert gauge.outside == 0


def test_rss_above_the_baseline_beyond_the_charges_is_counted(statm: Path) -> None:
    """The baseline is the RSS less what the budget charges then; later, RSS growth the charges do
    not explain (an encoder, Python objects) shrinks what is left to fetch."""
    gauge = MemoryGauge(str(statm), read_every_s=0)
    budget = ByteBudget(80 * MIB, held=True, gauge=gauge)
    budget.pinned = 10 * MIB  # answers in memory when the baseline is taken
    set_rss(statm, 110 * MIB)
    gauge.start(budget.charged())
    assert gauge.baseline == 100 * MIB
    assert budget.left() == 70 * MIB  # nothing outside yet

    set_rss(statm, 140 * MIB)  # 40 above idle, 10 of them charged
    budget.reserved = 5 * MIB
    assert budget.left() == 80 * MIB - 40 * MIB - 5 * MIB
    assert gauge.outside == 30 * MIB

    set_rss(statm, 105 * MIB)  # below what the charges say: the charges count, nothing more
    assert budget.left() == 80 * MIB - 10 * MIB - 5 * MIB
    assert gauge.outside == 0
    gauge.stop()


def test_outside_counts_at_most_half_the_limit_and_says_so(
    statm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A budget smaller than the daemon's own working set still fetches (half of it), and the
    counter and a warning say the RSS may exceed the limit."""
    gauge = MemoryGauge(str(statm), read_every_s=0)
    budget = ByteBudget(8 * MIB, held=True, gauge=gauge)
    gauge.start(0)
    before = metrics.memory_outside_capped._value.get()
    set_rss(statm, 150 * MIB)
    assert budget.left() == 4 * MIB
    assert gauge.outside == 50 * MIB
    assert gauge.capped == 1
    assert metrics.memory_outside_capped._value.get() == before + 1
    assert not budget.exhausted()  # a second reading
    assert gauge.capped == 2
    warned = [r for r in caplog.records if "over half of max_buffered_bytes" in r.getMessage()]
    assert len(warned) == 1  # one warning per WARN_EVERY_S
    gauge.stop()


def test_a_missing_statm_leaves_the_gauge_off(tmp_path: Path) -> None:
    """Without /proc the budget is its charges alone; start logs why and does not raise."""
    gauge = MemoryGauge(str(tmp_path / "absent"), read_every_s=0)
    budget = ByteBudget(8 * MIB, held=True, gauge=gauge)
    gauge.start(0)
    assert gauge.baseline is None
    assert budget.left() == 8 * MIB


def test_stop_is_idempotent_and_turns_the_gauge_off(statm: Path) -> None:
    gauge = MemoryGauge(str(statm), read_every_s=0)
    gauge.start(0)
    gauge.stop()
    gauge.stop()
    assert gauge.baseline is None
    assert gauge.excess(0, 8 * MIB) == 0


def test_the_real_statm_reads_this_process() -> None:
    """On Linux the default path reads this process's resident bytes."""
    gauge = MemoryGauge()
    gauge.start(0)
    try:
        rss = gauge.rss()
        with open("/proc/self/status") as f:
            vmrss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        assert abs(rss - vmrss) < 16 * MIB
        assert rss > 10 * MIB
    finally:
        gauge.stop()


def test_used_is_what_left_counted_without_reading_again(statm: Path) -> None:
    """``used()`` (the status's budget_used_bytes) is the charges (pinned over buffered), the fetches
    in flight and what the last reading counted outside them, the cap applied; it reads nothing."""
    gauge = MemoryGauge(str(statm), read_every_s=0)
    budget = ByteBudget(40 * MIB, held=True, gauge=gauge)
    gauge.start(0)
    budget.pinned, budget.buffered, budget.reserved = 10 * MIB, 4 * MIB, 3 * MIB
    set_rss(statm, 116 * MIB)  # 16 above idle, 6 of them outside the charges
    assert budget.left() == 40 * MIB - 19 * MIB
    assert budget.used() == 19 * MIB
    set_rss(statm, 200 * MIB)  # not read by used()
    assert budget.used() == 19 * MIB
    budget.left()  # 90 outside: counted at half the limit
    assert budget.used() == 10 * MIB + 3 * MIB + 20 * MIB
    gauge.stop()
    assert budget.used() == 13 * MIB


def test_code_loaded_after_the_baseline_raises_it(statm: Path) -> None:
    """The admin endpoint, built at its first connection, loads ~10 MiB of code after the baseline:
    around it (``loading_code``) the RSS it adds beyond the charges raises the baseline, so what is
    left to fetch is what it was (before: 10 MiB less, for as long as the daemon ran). Growth the
    charges explain, and a shrink, leave the baseline alone; before the baseline nothing moves."""
    gauge = MemoryGauge(str(statm), read_every_s=0)
    budget = ByteBudget(80 * MIB, held=True, gauge=gauge)
    with gauge.loading_code(budget.charged):  # no baseline yet: the later one holds the code
        set_rss(statm, 110 * MIB)
    assert gauge.baseline is None
    gauge.start(budget.charged())
    assert gauge.baseline == 110 * MIB

    with gauge.loading_code(budget.charged):
        set_rss(statm, 120 * MIB)  # the import
        budget.pinned = 4 * MIB  # an answer arrived meanwhile: charged, so not code
        set_rss(statm, 124 * MIB)
    assert gauge.baseline == 120 * MIB
    assert budget.left() == 80 * MIB - 4 * MIB

    with gauge.loading_code(budget.charged):
        set_rss(statm, 118 * MIB)  # memory returned meanwhile
    assert gauge.baseline == 120 * MIB


def test_a_young_reading_is_counted_again_without_reading(statm: Path) -> None:
    """Within ``read_every_s`` of a reading the budget counts that reading's outside again (a read
    releases the GIL, and taking it back waits for a landing thread); past it, the RSS is read
    again. The fake clock is the gauge's own."""
    now = [100.0]
    gauge = MemoryGauge(str(statm), read_every_s=0.01, clock=lambda: now[0])
    budget = ByteBudget(80 * MIB, held=True, gauge=gauge)
    gauge.start(0)
    set_rss(statm, 120 * MIB)  # 20 outside
    assert budget.left() == 60 * MIB
    set_rss(statm, 150 * MIB)  # 50 outside, not read yet
    now[0] += 0.005
    budget.pinned = 5 * MIB  # the charges still count as they are
    assert budget.left() == 80 * MIB - 5 * MIB - 20 * MIB
    assert gauge.outside == 20 * MIB
    now[0] += 0.006  # 11 ms after the reading
    assert budget.left() == 80 * MIB - 5 * MIB - 40 * MIB  # the limit's half: 40 of the 45 outside
    assert gauge.outside == 45 * MIB
    gauge.stop()
