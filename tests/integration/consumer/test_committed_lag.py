"""What lag means (issue 31, item 5), on a real daemon process and real brokers: LAG, /status's
"lag", `mqd status` and mqd_consumer_lag are the log end minus the landed (committed) offset, as
kafka-consumer-groups computes it, so records fetched but waiting for their file to be cut are lag;
the fetch position's figure is "fetch_lag". TIME-LAG is the age of the oldest record not landed
yet: 0 on an idle, caught-up topic, where it used to grow with the age of the newest landed record."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from support.cli import mqd, produce, write_config
from support.harness import Cluster

from mqd.operator.cli import main
from mqd.waiting import wait_until_sync

RECORDS = 300


def _get(state_dir: Path, path: str) -> str | None:
    try:
        info = json.loads((state_dir / "admin.json").read_text())
        with urllib.request.urlopen(f"{info['url']}{path}", timeout=5) as resp:
            body: bytes = resp.read()
            return body.decode()
    except (OSError, ValueError, KeyError):
        return None


def assignment(state_dir: Path) -> dict[str, Any]:
    """/status's per-partition entries (empty while the daemon does not answer)."""
    text = _get(state_dir, "/status")
    return {} if text is None else dict(json.loads(text).get("consumer", {}).get("assignment", {}))


def gauge(state_dir: Path, name: str) -> dict[int, float]:
    """One per-partition gauge of /metrics, by partition."""
    out: dict[int, float] = {}
    for fam in text_string_to_metric_families(_get(state_dir, "/metrics") or ""):
        for s in fam.samples:
            if s.name == name and s.labels.get("topic") == "events":
                out[int(s.labels["partition"])] = s.value
    return out


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": 2})


def start_daemon(tmp_path: Path, cluster: Cluster, **landing: Any) -> Iterator[Path]:
    """A daemon polling log ends every 0.3 s; yields its state dir; stopped (or killed) after."""
    cfg = write_config(tmp_path, cluster, consumer={"log_end_interval": 0.3}, landing=landing)
    state = tmp_path / "state"
    res = mqd("start", "-c", str(cfg))
    assert res.returncode == 0, res.stderr + (state / "mqd.log").read_text()
    pid = int((state / "mqd.pid").read_text())
    try:
        yield state
    finally:
        if mqd("stop", "-c", str(cfg)).returncode != 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def waiting_daemon(tmp_path: Path, cluster: Cluster) -> Iterator[Path]:
    """Files are cut after an hour: whatever it fetches waits in its buffers, not landed."""
    yield from start_daemon(tmp_path, cluster, max_age=3600)


@pytest.fixture
def landing_daemon(tmp_path: Path, cluster: Cluster) -> Iterator[Path]:
    """Files are cut 0.3 s after their first record: what it fetches lands at once."""
    yield from start_daemon(tmp_path, cluster, max_age=0.3)


def test_records_fetched_but_not_landed_are_lag(cluster: Cluster, waiting_daemon: Path) -> None:
    """Every record fetched (fetch lag 0) and none landed: the lag is every record in /status,
    /metrics and `mqd status` (it was 0: the fetch position's figure), and the time lag is the
    waiting records' age, which grows while they wait."""
    state = waiting_daemon
    produce(cluster, RECORDS, batch=20)

    def fetched_all() -> bool:
        parts = assignment(state).values()
        return sum(p["log_end"] or 0 for p in parts) == RECORDS and all(p["fetch_lag"] == 0 for p in parts)

    wait_until_sync(fetched_all, timeout=30, what="every record fetched (fetch lag 0)")
    wait_until_sync(
        lambda: sum(gauge(state, "mqd_consumer_lag").values()) == RECORDS,
        timeout=30,
        what="mqd_consumer_lag counting the records not landed",
    )
    parts = assignment(state)
    assert sum(p["lag"] for p in parts.values()) == RECORDS, parts
    assert all(p["landed"] == 0 and p["lag"] == p["log_end"] for p in parts.values()), parts
    assert sum(gauge(state, "mqd_consumer_fetch_lag").values()) == 0
    # /status dates the waiting records as the metric does: by the log-end poller, not by event time
    assert all(p["unlanded_since_ms"] is not None and p["time_lag_s"] > 0 for p in parts.values()), parts
    cfg = state.parent / "mqd.toml"
    res = CliRunner().invoke(main, ["status", "-c", str(cfg)])
    assert f"total lag {RECORDS} records not landed" in res.stdout, res.stdout

    first = gauge(state, "mqd_consumer_time_lag_seconds")
    assert first and all(v > 0 for v in first.values()), first
    wait_until_sync(
        lambda: all(v >= first[p] + 0.5 for p, v in gauge(state, "mqd_consumer_time_lag_seconds").items()),
        timeout=30,
        what="the time lag of the waiting records growing",
    )


def test_time_lag_on_an_idle_caught_up_topic_is_zero_and_does_not_grow(
    cluster: Cluster, landing_daemon: Path
) -> None:
    """Everything landed and nothing new: over several log-end polls (2 s of the daemon's uptime)
    the time lag stays 0 in /status and /metrics, and the lag 0; it used to be now minus the
    newest landed record's time, growing on a quiet topic (an alert on it fired)."""
    state = landing_daemon
    produce(cluster, RECORDS, batch=20)

    def landed_all() -> bool:
        parts = assignment(state).values()
        polled = gauge(state, "mqd_consumer_lag")  # the gauges follow at the next log-end poll
        landed = sum(p["landed"] or 0 for p in parts) == RECORDS and all(p["lag"] == 0 for p in parts)
        return landed and len(polled) == 2 and not any(polled.values())

    wait_until_sync(landed_all, timeout=30, what="every record landed, in /status and /metrics")
    seen: list[tuple[Any, ...]] = []
    start = time.monotonic()

    def idle_for_two_seconds() -> bool:
        parts = assignment(state)
        seen.append(tuple((p["time_lag_s"], p["lag"]) for p in parts.values()))
        seen.append(tuple(gauge(state, "mqd_consumer_time_lag_seconds").values()))
        return time.monotonic() - start >= 2.0 and len(seen) >= 10

    wait_until_sync(idle_for_two_seconds, timeout=30, what="2 s of idle readings")
    assert all(value in (0, (0.0, 0)) for reading in seen for value in reading), seen
