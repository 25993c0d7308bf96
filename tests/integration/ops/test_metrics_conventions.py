"""/metrics by Prometheus conventions (issue 17): no ``*_created`` series, units at the end of names
(before ``_total``), ``mqd_build_info{version}``, the per-partition offset gauges, and the fetch
latency kept apart from the long-poll wait (measured against a real broker)."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.consumer import config, new_consumer

from mqd import __version__, metrics
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

# old name -> new name (the report's rename list); counters gain _total on the wire
RENAMED = {
    "mqd_records_fetched": "mqd_fetched_records",
    "mqd_bytes_fetched": "mqd_fetched_bytes",
    "mqd_files_published": "mqd_published_files",
    "mqd_records_published": "mqd_published_records",
    "mqd_bytes_published": "mqd_published_bytes",
    "mqd_records_cut": "mqd_cut_records",
}


def _families() -> dict[str, Any]:
    text = generate_latest(metrics.REGISTRY).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_no_created_series_and_units_last() -> None:
    """Every counter and histogram is exported without its ``_created`` twin; the renamed families
    exist under their new names only; build info carries the version."""
    metrics.records_fetched.labels("conv", "0").inc()
    metrics.fetch_latency.labels("n").observe(0.01)
    metrics.commits.labels("ok").inc()
    text = generate_latest(metrics.REGISTRY).decode()
    assert "_created" not in text
    families = _families()
    for old, new in RENAMED.items():
        assert new in families, new
        assert old not in families, old
    assert f'mqd_build_info{{version="{__version__}"}} 1.0' in text
    for name in ("mqd_log_end_offset", "mqd_committed_offset", "mqd_landed_offset"):
        assert families[name].type == "gauge"
    assert families["mqd_landing_freshness_seconds"].type == "gauge"
    assert families["mqd_fetch_duration_seconds"].type == "histogram"


def _hist(name: str, node: str) -> tuple[float, float]:
    """(sum, count) of one node's histogram."""
    reg = metrics.REGISTRY
    return (
        reg.get_sample_value(f"{name}_sum", {"node": node}) or 0.0,
        reg.get_sample_value(f"{name}_count", {"node": node}) or 0.0,
    )


async def test_fetch_latency_excludes_the_long_poll_wait(cluster_factory: Any) -> None:
    """An idle consumer long-polls 400 ms per fetch: the duration histogram shows the wait, the
    latency histogram only what the request took beyond it (well under the wait)."""
    cluster = cluster_factory(topics={"events": 1})
    node = cluster.master(0)
    cfg = config(cluster, fetch_max_wait_ms=400)
    d0, c0 = _hist("mqd_fetch_duration_seconds", node)
    l0, _ = _hist("mqd_fetch_latency_seconds", node)
    async with BrokerClient(request_timeout=5) as client, new_consumer(cfg, client=client):
        await wait_until(
            lambda: _hist("mqd_fetch_duration_seconds", node)[1] >= c0 + 4, timeout=30, what="4 long polls"
        )
    d1, c1 = _hist("mqd_fetch_duration_seconds", node)
    l1, lc1 = _hist("mqd_fetch_latency_seconds", node)
    n = c1 - c0
    assert lc1 >= n  # one latency observation per fetch
    assert (d1 - d0) / n >= 0.35  # the broker held each idle fetch for its max wait
    # what is left of each round trip once the wait is taken out
    assert (l1 - l0) / n <= (d1 - d0) / n - 0.35
