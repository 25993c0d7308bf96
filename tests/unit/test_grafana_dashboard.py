"""docs/grafana/mqd.json reads only what mqd exports: every metric name in every query (panels and
template variables) is a series the daemon's /metrics registry serves under that exact name (counters
with ``_total``, histograms as ``_bucket``/``_sum``/``_count``), and the dashboard is well formed
(unique panel ids, a 24-column grid, every query on the data source variable)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mqd.sources.kafka.record_batch  # noqa: F401  (registers the Kafka source's counters)
from mqd import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "mqd.json"
METRIC = re.compile(r"\b((?:mqd|process)_[a-z0-9_]+)\b")
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "gauge": ("",),
    "info": ("_info",),
}


def exported() -> set[str]:
    """Every series name the registry can serve (also for label sets not seen yet)."""
    names = set()
    for family in metrics.REGISTRY.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def queries(dash: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for panel in dash["panels"]:
        out.extend(t["expr"] for t in panel.get("targets", []))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]
            out.append(q["query"] if isinstance(q, dict) else q)
    return out


def test_every_metric_the_dashboard_reads_is_exported() -> None:
    """No query names a metric /metrics does not serve (a renamed metric would leave a panel empty)."""
    dash = json.loads(DASHBOARD.read_text())
    known = exported()
    used: set[str] = set()
    for expr in queries(dash):
        names = set(METRIC.findall(expr))
        assert names, f"query names no mqd metric: {expr}"
        used |= names
    assert used - known == set(), f"not exported: {sorted(used - known)}"
    # the issues' figures are all on it (issue 31: lag and time lag as Kafka users mean them)
    for name in (
        "mqd_consumer_lag",
        "mqd_consumer_fetch_lag",
        "mqd_consumer_time_lag_seconds",
        "mqd_committed_offset",
        "mqd_landed_offset",
        "mqd_build_info",
        "mqd_fetch_latency_seconds_bucket",
        "mqd_stuck_partitions",
    ):
        assert name in used, name


def test_dashboard_is_well_formed() -> None:
    """Unique panel ids, panels inside the 24-column grid, every panel and query on ${datasource}."""
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "instance"}
