"""True lag (issue 17): the daemon, a real process, asks the broker for every owned partition's log
end on a timer, so partitions paused while the producer writes show their growing lag in /metrics,
/status and `mqd status`, and `mqd status` exits 4 (stuck) until they land again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from support.cli import mqd, produce, write_config
from support.consumer import FAST, new_consumer
from support.fake_kafka import FakeKafka, values
from support.harness import Cluster

from mqd.config import ConsumerConfig
from mqd.consumer import TopicPartition
from mqd.operator.cli import EXIT_STUCK, main
from mqd.waiting import wait_until, wait_until_sync

PAUSED = (1, 2)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process; the daemon it talks to is a real process."""
    res = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def _get(state_dir: Path, path: str) -> str | None:
    try:
        info = json.loads((state_dir / "admin.json").read_text())
        with urllib.request.urlopen(f"{info['url']}{path}", timeout=5) as resp:
            body: bytes = resp.read()
            return body.decode()
    except (OSError, ValueError, KeyError):
        return None


def status(state_dir: Path) -> dict[str, Any]:
    text = _get(state_dir, "/status")
    return {} if text is None else dict(json.loads(text))


def gauges(state_dir: Path, name: str) -> dict[int, float]:
    """One per-partition gauge of /metrics, by partition."""
    text = _get(state_dir, "/metrics") or ""
    out: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("topic") == "events":
                out[int(s.labels["partition"])] = s.value
    return out


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": 4})


@pytest.fixture
def daemon(tmp_path: Path, cluster: Cluster) -> Iterator[Path]:
    """A daemon polling log ends every 0.3 s, stuck after 3 polls; yields its config file."""
    cfg = write_config(tmp_path, cluster, consumer={"log_end_interval": 0.3, "stuck_intervals": 3})
    res = mqd("start", "-c", str(cfg))
    state = tmp_path / "state"
    assert res.returncode == 0, res.stderr + (state / "mqd.log").read_text()
    pid = int((state / "mqd.pid").read_text())
    try:
        yield cfg
    finally:
        res = mqd("stop", "-c", str(cfg))
        if res.returncode != 0:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_paused_partitions_show_growing_lag_and_status_exits_stuck(
    tmp_path: Path, cluster: Cluster, daemon: Path
) -> None:
    """Two partitions paused while a producer writes: their log end and lag grow in /metrics and
    /status (the timer asks the broker; no fetch answer moves them), the other two keep landing
    and are not stuck, `mqd status` names the stuck ones and exits 4; resumed and landed, it
    exits 0 again."""
    cfg, state = daemon, tmp_path / "state"
    produce(cluster, 400, batch=20)  # spread over the four partitions
    wait_until_sync(
        lambda: sum(gauges(state, "mqd_landed_offset").values()) == 400,
        timeout=30,
        what="400 records landed and their landed offsets in /metrics",
    )
    before = gauges(state, "mqd_landed_offset")
    res = cli("pause", "-c", str(cfg), *(f"events:{p}" for p in PAUSED))
    assert res.returncode == 0, res.stderr
    producer = subprocess.Popen(
        [
            *(sys.executable, "-m", "mqd.operator.cli", "produce", "--bootstrap", cluster.bootstrap),
            *("--topic", "events", "--count", "1000000", "--rate", "400", "--batch", "20"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_sync(
            lambda: all(gauges(state, "mqd_consumer_lag").get(p, 0) > 0 for p in PAUSED),
            timeout=30,
            what="lag of the paused partitions in /metrics",
        )
        first = gauges(state, "mqd_consumer_lag")
        wait_until_sync(
            lambda: all(gauges(state, "mqd_consumer_lag").get(p, 0) > first[p] + 20 for p in PAUSED),
            timeout=30,
            what="the paused partitions' lag growing",
        )
        ends = gauges(state, "mqd_log_end_offset")
        landed = gauges(state, "mqd_landed_offset")
        assert all(ends[p] > before[p] and landed[p] == before[p] for p in PAUSED), (ends, landed, before)

        # each partition is judged at its own log-end polls: the first stuck one already makes the
        # command exit 4, so wait until the answer names both
        def both_stuck() -> bool:
            res = cli("status", "-c", str(cfg))
            return res.returncode == EXIT_STUCK and "2 partitions stuck" in res.stdout

        wait_until_sync(both_stuck, timeout=30, what="mqd status exits stuck, naming both")
        res = cli("status", "-c", str(cfg))
        assert res.returncode == EXIT_STUCK, res.stdout
        assert "2 partitions stuck" in res.stdout and "events/1, events/2" in res.stdout, res.stdout
        assert "COMMITTED" in res.stdout and "LOG-END" in res.stdout and "TIME-LAG" in res.stdout
        st = status(state)["consumer"]
        assert st["totals"]["stuck"] == ["events/1", "events/2"]
        for p in PAUSED:
            entry = st["assignment"][f"events/{p}"]
            assert entry["paused"] and entry["stuck"] and entry["landed"] == before[p]
            assert entry["log_end"] > before[p] and entry["lag"] > 0 and entry["landed_lag"] > 0
        for p in (0, 3):
            entry = st["assignment"][f"events/{p}"]
            assert not entry["stuck"] and entry["time_lag_s"] is not None
        text = _get(state, "/metrics") or ""
        assert "\nmqd_stuck_partitions 2.0\n" in text
    finally:
        producer.terminate()
        producer.wait(timeout=30)

    assert cli("resume", "-c", str(cfg), "events").returncode == 0
    wait_until_sync(
        lambda: gauges(state, "mqd_log_end_offset") == gauges(state, "mqd_landed_offset"),
        timeout=30,
        what="everything landed: landed offsets equal the log ends",
    )
    wait_until_sync(
        lambda: cli("status", "-c", str(cfg)).returncode == 0,
        timeout=30,
        what="mqd status healthy (not stuck) again",
    )


async def test_kafka_source_log_end_polled_for_a_paused_partition(tmp_path: Path) -> None:
    """The timer goes through the Source seam, so the Kafka source has true lag too: a partition
    paused while its log grows on a (scripted) Kafka broker shows the new log end and lag, and is
    judged stuck, while the partition that keeps being consumed is not."""
    broker = await FakeKafka("events", 2).start()
    try:
        cfg = ConsumerConfig(
            **{
                **FAST,
                "source": "kafka",
                "mode": "broadcast",
                "consume_from": "first",
                "client_id": "lag-kafka",
                "bootstrap": [broker.bootstrap],
                "topics": ["events"],
                "offset_file": tmp_path / "offsets.json",
                "log_end_interval": 0.1,
                "stuck_intervals": 2,
            }
        )
        tp0, tp1 = TopicPartition("events", 0), TopicPartition("events", 1)
        async with new_consumer(cfg, auto_mark=True) as consumer:
            consumer.pause([tp1])
            for n in range(5):
                broker.logs[1].append(values(n, b"v%d" % n))
                await asyncio.sleep(0.15)  # the producer's pace: one record per poll or so

            def snap(tp: TopicPartition) -> Any:
                consumer.fetched_batches()  # auto_mark: tp0's records count as landed
                return next(p for p in consumer.snapshot().partitions if p.tp == tp)

            await wait_until(lambda: snap(tp1).log_end == 5, timeout=10, what="tp1's polled log end")
            p1 = snap(tp1)
            assert p1.paused and p1.lag == 5 and p1.landed_lag == 5, p1
            await wait_until(lambda: snap(tp1).stuck, timeout=10, what="tp1 stuck")
            assert not snap(tp0).stuck
    finally:
        await broker.stop()
