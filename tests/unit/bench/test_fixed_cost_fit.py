"""bench.fixed_cost's summary: the fixed cost, CPU and wall, is the intercept of the line through a
round's two sizes, its median over rounds; the tail and per-size figures are medians."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from support import REPO_ROOT


@pytest.fixture
def fc(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # bench is a package of the project root, not installed
    from bench import fixed_cost

    yield fixed_cost


def _run(n: int, size: int, cpu: float, wall: float, tail: float | None) -> dict[str, Any]:
    return {
        "variant": "new",
        "source": "mqd",
        "size": size,
        "round": n,
        "exact": True,
        "cpu_s": cpu,
        "wall_s": wall,
        "spawn_to_first_fetch_s": 0.3,
        "tail_s": tail,
        "load": 1.0,
    }


def test_fixed_cpu_and_wall_are_intercepts_medians_over_rounds(fc: ModuleType) -> None:
    # CPU = 0.4 + 1.0 s/M, wall = 1.0 + 0.5 s/M in rounds 0 and 1; round 2 is off (median ignores it)
    runs = [
        _run(0, 200_000, 0.6, 1.1, 0.1),
        _run(0, 1_000_000, 1.4, 1.5, 0.1),
        _run(1, 200_000, 0.6, 1.1, 0.2),
        _run(1, 1_000_000, 1.4, 1.5, None),
        _run(2, 200_000, 0.9, 2.0, 0.3),
        _run(2, 1_000_000, 1.3, 2.0, 0.3),
    ]
    (row,) = fc.summarize(runs, [200_000, 1_000_000])
    assert (row["fixed_cpu_s"], row["cpu_s_per_million"]) == (0.4, 1.0)
    assert (row["fixed_wall_s"], row["wall_s_per_million"]) == (1.0, 0.5)
    assert row["tail_s"] == 0.2  # the runs that logged "burst complete"
    assert (row["wall_s_at_200000"], row["cpu_s_at_1000000"]) == (1.1, 1.4)
    table = fc.markdown({"sizes": [200_000, 1_000_000], "summary": [row]})
    assert "| mqd | new | 0.3 | 0.4 | 1.0 | 1.0 | 0.5 | 0.2 | 0.6 | 1.1 | 1.4 | 1.5 | True | 1.0 |" in table


def test_paired_differences_are_per_round_medians_against_the_first_variant(fc: ModuleType) -> None:
    base = [_run(n, 200_000, 1.0 + n, 2.0 + n, 0.3) | {"variant": "base"} for n in range(3)]
    new = [_run(n, 200_000, 0.9 + n, 1.8 + n, 0.1) | {"variant": "new"} for n in range(3)]
    new[2]["cpu_s"] = 9.0  # one round hit by load: the median ignores it
    (row,) = fc.paired(base + new, [200_000])
    assert (row["variant"], row["against"], row["rounds"]) == ("new", "base", 3)
    assert (row["cpu_s"], row["wall_s"], row["tail_s"]) == (-0.1, -0.2, -0.2)
