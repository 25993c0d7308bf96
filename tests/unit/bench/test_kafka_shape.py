"""The kafka shape's own figures (bench/kafka_shape.py, bench/shapes.py): fetch requests and
partitions per request read from the daemon's Prometheus text, the offset-file check, and the
summary of RSS above the idle baseline against the byte budget."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from support import REPO_ROOT

from mqd import metrics
from mqd.metrics import fetch_partitions, fetch_requests


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # bench is a package of the project root, not installed
    from bench import kafka_shape, shapes

    yield kafka_shape, shapes


def test_fetch_figures_read_the_daemons_own_metrics(bench: tuple[ModuleType, ModuleType]) -> None:
    """Requests per node come from mqd_fetch_requests_total and partitions per request from the
    mqd_fetch_partitions histogram, as the daemon's registry renders them (not a hand-made text)."""
    kafka_shape, _ = bench
    from prometheus_client import generate_latest

    before = kafka_shape.fetch_figures(generate_latest(metrics.REGISTRY).decode())
    base = before["fetch_requests_per_node"].get("bench-node-7", 0)
    for parts in (12, 12, 6):
        fetch_requests.labels("bench-node-7").inc()
        fetch_partitions.labels("bench-node-7").observe(parts)
    got = kafka_shape.fetch_figures(generate_latest(metrics.REGISTRY).decode())
    assert got["fetch_requests_per_node"]["bench-node-7"] == base + 3
    assert got["leader_nodes_fetched"] >= 1
    assert kafka_shape.fetch_figures(None) == {
        "fetch_requests_per_node": {},
        "leader_nodes_fetched": 0,
        "partitions_per_request": None,
    }
    one_node = "\n".join(
        [
            "# HELP mqd_fetch_requests_total Fetch requests sent",
            'mqd_fetch_requests_total{node="111"} 4.0',
            'mqd_fetch_requests_created{node="111"} 1.7e9',
            'mqd_fetch_partitions_sum{node="111"} 42.0',
            'mqd_fetch_partitions_count{node="111"} 4.0',
        ]
    )
    assert kafka_shape.fetch_figures(one_node) == {
        "fetch_requests_per_node": {"111": 4},
        "leader_nodes_fetched": 1,
        "partitions_per_request": 10.5,
    }


def test_committed_total_sums_the_offset_file(bench: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    """A broadcast daemon's committed offsets are its offset file's (the topic's partitions summed);
    no file is None, never 0 (which would pass an empty topic's check)."""
    kafka_shape, _ = bench
    assert kafka_shape.committed_total(tmp_path, "events") is None
    doc = {"version": 1, "offsets": {"events": {"0": 500, "1": 250}, "other": {"0": 9}}}
    (tmp_path / "offsets.json").write_text(json.dumps(doc))
    assert kafka_shape.committed_total(tmp_path, "events") == 750


def _run(peak: float, requests: int, per_request: float | None, name: str = "mqd") -> dict[str, Any]:
    return {
        "name": name,
        "peak_rss_mb": peak,
        "fetch_requests_per_node": {"111": requests},
        "leader_nodes_fetched": 1,
        "partitions_per_request": per_request,
    }


def test_kafka_summary_measures_rss_above_idle_against_the_budget(
    bench: tuple[ModuleType, ModuleType],
) -> None:
    """The summary takes mqd's runs only (failed ones aside), medians the fetch figures and states
    whether the peak RSS above the idle daemon's stayed within consumer.max_buffered_bytes."""
    _, shapes = bench
    runs = [
        _run(250.0, 300, 11.5),
        _run(260.0, 310, 12.0),
        _run(240.0, 290, None),
        _run(999.0, 1, 1.0, name="confluent-kafka"),
        {"name": "mqd", "error": "exit 1"},
    ]
    out = shapes.kafka_summary(runs, {"rss_mb": 180.0})
    assert out["fetch_requests"] == {"median": 300.0, "min": 290.0, "max": 310.0}
    assert out["partitions_per_request"] == {"median": 11.75, "min": 11.5, "max": 12.0}
    assert out["rss_above_idle_mb"] == {"median": 70.0, "min": 60.0, "max": 80.0}
    assert out["rss_above_idle_within_budget"] is True
    over = shapes.kafka_summary([_run(270.0, 300, 12.0)], {"rss_mb": 180.0})
    assert over["rss_above_idle_within_budget"] is False
    assert over["budget_with_landing_mb"] == 112.0  # 80 MiB + landing.max_bytes 32 MiB
    assert over["rss_above_idle_within_budget_with_landing"] is True
    assert "rss_above_idle_mb" not in shapes.kafka_summary(runs, None)


def test_kafka_summary_reports_the_anonymous_part_apart(bench: tuple[ModuleType, ModuleType]) -> None:
    """Besides the whole RSS, its anonymous part above the idle daemon's anonymous RSS: the library
    code a burst touches (libparquet, the codecs) is file-backed, not memory the daemon holds."""
    _, shapes = bench
    runs = [
        {**_run(280.0, 300, 12.0), "peak_anon_mb": 180.0},
        {**_run(290.0, 300, 12.0), "peak_anon_mb": 186.0},
    ]
    out = shapes.kafka_summary(runs, {"rss_mb": 140.0, "anon_mb": 60.0})
    assert out["rss_above_idle_mb"] == {"median": 145.0, "min": 140.0, "max": 150.0}
    assert out["anon_above_idle_mb"] == {"median": 123.0, "min": 120.0, "max": 126.0}
    assert "anon_above_idle_mb" not in shapes.kafka_summary(runs, {"rss_mb": 140.0})  # an older idle figure
