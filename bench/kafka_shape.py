"""The ``kafka`` shape of ``python -m bench`` (issue 14): mqd with ``consumer.source = "kafka"``
against the confluent-kafka and aiokafka consumers, all reading the same Tansu broker and the same
records (produced once), end to end into published Parquet.

mqd's run is ``mqd run --burst`` in broadcast mode: it assigns itself every partition and keeps its
offsets in its own file, as the alternatives assign every partition without a group. (A consumer
group would add the broker's join wait, ~5 s on Tansu for a fresh group, like Kafka's
``group.initial.rebalance.delay.ms``; the group path's start-up is measured once, apart, as
``cluster_mode_spawn_to_first_fetch_s``.) Every run is timed and checked like every other pipeline of
bench/shapes.py: the landed files hold offsets 0..n-1 of every partition once, and the offset file
adds up to the records. Beside the rates it reports what issue 14 asks of the fetcher and the budget:

- **fetch requests per round**: the daemon's own metrics (``mqd_fetch_requests_total`` and the
  ``mqd_fetch_partitions`` histogram, scraped from its admin endpoint every half second; the last
  scrape before exit counts): requests per leader node, partitions per request. One request in
  flight per node carrying every fetchable partition means requests per round = leader nodes.
- **RSS above the idle baseline**: the burst runs' peak RSS minus the RSS of the same daemon with
  nothing to fetch (everything committed), against ``consumer.max_buffered_bytes`` (the byte budget
  the daemon charges whole fetch answers to until they are published).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.common import WatchedProcess, Workload, check_exact, process_cpu_seconds
from bench.pipeline import LandedCounter, landed_files
from mqd.testing import daemon_section, to_toml
from mqd.testing.tansu import Tansu

MAX_BUFFERED_BYTES = 80 * 2**20  # consumer.max_buffered_bytes, the daemon's default


class KafkaBroker:
    """One Apache Kafka broker (mqd.testing.KafkaCluster, KRaft) in Tansu's place: the same
    ``bootstrap``, ``process`` (its pid for the broker's CPU seconds), ``create_topic``, ``start``
    and ``stop``, so every pipeline of the shape runs on it unchanged. A fresh group's join is not
    delayed (``group.initial.rebalance.delay.ms=0``; Tansu waits 5 s), so ``cluster_mode`` differs
    by that. The JVM is bench.kafka_to_table's (C2, 1 GB heap), not the test broker's."""

    def __init__(self, workdir: Path) -> None:
        from bench.kafka_to_table import BROKER_JVM_FLAGS
        from mqd.testing.kafka_cluster import KafkaCluster

        self.cluster = KafkaCluster(
            workdir, 1, settings={"group.initial.rebalance.delay.ms": "0"}, jvm_flags=BROKER_JVM_FLAGS
        )
        self.bootstrap = self.cluster.bootstrap
        self.process = self.cluster.brokers[0]  # a ManagedProcess, like Tansu's

    def start(self) -> KafkaBroker:
        self.cluster.start()
        return self

    def create_topic(self, name: str, partitions: int) -> None:
        self.cluster.create_topic(name, partitions)

    def stop(self) -> None:
        self.cluster.stop()


def broker(kind: str, workdir: Path) -> Tansu | KafkaBroker:
    """The shape's broker: Tansu (memory storage, the issue 14 runs) or one Apache Kafka broker."""
    if kind == "kafka":
        return KafkaBroker(workdir / "kafka")
    return Tansu(workdir / "tansu")


def daemon_config(
    path: Path,
    bootstrap: str,
    *,
    topic: str,
    group: str,
    landing: Path,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    mode: str = "broadcast",
) -> Path:
    """A daemon reading ``topic`` from the Kafka cluster at ``bootstrap`` (``group`` names its state
    folder, and its consumer group in cluster mode), its admin endpoint on a free port
    (state_dir/admin.json names it) for the metrics."""
    state = path.parent / f"state-{group}"
    path.write_text(
        to_toml(
            {
                "consumer": {
                    "source": "kafka",
                    "group": group,
                    "client_id": f"{group}-daemon",
                    "bootstrap": [bootstrap],
                    "topics": [topic],
                    "consume_from": "first",
                    "mode": mode,
                    "offset_file": str(state / "offsets.json"),
                    "max_buffered_bytes": MAX_BUFFERED_BYTES,
                },
                "landing": {
                    "dir": str(landing),
                    "max_records": max_records,
                    "max_bytes": max_bytes,
                    "max_age": max_age,
                    "compression": compression,
                },
                "admin": {"enabled": True, "host": "127.0.0.1", "port": 0},
                "log": {"level": "info", "format": "json"},
                "daemon": daemon_section(state),
            }
        )
    )
    return path


def argv(config: Path, *, burst: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mqd.operator.cli",
        "run",
        "--config",
        str(config),
        *(["--burst"] if burst else []),
    ]


class MetricsScraper:
    """Reads the daemon's Prometheus metrics every ``interval`` seconds while it runs; keeps the
    last answer (the counters only grow, so the last scrape before exit is the run's figure)."""

    def __init__(self, state_dir: Path, interval: float = 0.5) -> None:
        self.state_dir = state_dir
        self.interval = interval
        self.last: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _url(self) -> str | None:
        try:
            info = json.loads((self.state_dir / "admin.json").read_text())
        except (OSError, ValueError):
            return None
        url = info.get("url")
        return f"{url}/metrics" if isinstance(url, str) else None

    def _run(self) -> None:
        url: str | None = None
        while not self._stop.wait(self.interval):
            url = url or self._url()
            if url is None:
                continue
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    self.last = resp.read().decode()
            except OSError:
                continue  # not up yet, or gone: the last answer stands


def fetch_figures(text: str | None) -> dict[str, Any]:
    """Fetch requests per node and partitions per request from a Prometheus text answer."""
    requests: dict[str, float] = {}
    parts_sum: dict[str, float] = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        labels, _, value = rest.rpartition("} ")
        node = next(
            (kv.split("=", 1)[1].strip('"') for kv in labels.split(",") if kv.startswith("node=")), ""
        )
        if name == "mqd_fetch_requests_total":
            requests[node] = float(value)
        elif name == "mqd_fetch_partitions_sum":
            parts_sum[node] = float(value)
    total = sum(requests.values())
    return {
        "fetch_requests_per_node": {n: int(v) for n, v in requests.items()},
        "leader_nodes_fetched": sum(1 for v in requests.values() if v),
        "partitions_per_request": round(sum(parts_sum.values()) / total, 2) if total else None,
    }


def committed_total(state_dir: Path, topic: str) -> int | None:
    """Sum of the offsets in a broadcast daemon's offset file (None when it has none)."""
    try:
        doc = json.loads((state_dir / "offsets.json").read_text())
    except (OSError, ValueError):
        return None
    return sum(int(v) for v in doc.get("offsets", {}).get(topic, {}).values())


def run_mqd(
    tansu: Tansu | KafkaBroker,
    topic: str,
    work: Workload,
    workdir: Path,
    tag: str,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
    file_sizes: Callable[[list[Path]], dict[str, Any]],
) -> dict[str, Any]:
    """One ``mqd run --burst`` over the whole topic on Tansu (a fresh state folder and landing)."""
    group = f"bench-kafka-{tag}"
    landing = workdir / f"landing-mqd-{tag}"
    cfg = daemon_config(
        workdir / f"mqd-{tag}.toml",
        tansu.bootstrap,
        topic=topic,
        group=group,
        landing=landing,
        max_records=max_records,
        max_bytes=max_bytes,
        max_age=max_age,
        compression=compression,
    )
    pids = [tansu.process.pid] if tansu.process.pid else []
    cpu0 = process_cpu_seconds(pids)
    scraper = MetricsScraper(workdir / f"state-{group}")
    proc = WatchedProcess(argv(cfg, burst=True), log_path=workdir / f"mqd-{tag}.log", cwd=workdir)
    proc.start()
    scraper.start()
    try:
        stats = proc.finish(timeout)
    finally:
        scraper.stop()
    broker_cpu = process_cpu_seconds(pids) - cpu0
    if stats.exit_code != 0:
        return {"name": "mqd", "error": f"exit {stats.exit_code}; see {proc.log_path}"}
    files = landed_files(landing, topic)
    wrong = check_exact(files, work.per_partition())
    committed = committed_total(workdir / f"state-{group}", topic)
    if wrong is None and committed != work.records:
        wrong = f"committed {committed} of {work.records}"
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    first_fetch = common.log_event_time(proc.log_path, "first fetch sent")
    sizes = file_sizes(files)
    landed = work.records if wrong is None else LandedCounter(landing, topic)()
    shutil.rmtree(landing, ignore_errors=True)  # a whole copy of the records per run
    seconds = max(stats.ended_at - started, 1e-3)
    return {
        "name": "mqd",
        "records": landed,
        "exact": wrong is None,
        "inexact": wrong,
        "group": group,
        "process_seconds": round(stats.wall_s, 3),
        "records_per_s_whole_process": round(landed / stats.wall_s),
        "startup_seconds": round(started - stats.started_at, 3),
        "spawn_to_first_fetch_s": round(first_fetch - stats.started_at, 3) if first_fetch else None,
        "seconds": round(seconds, 3),
        "records_per_s": round(landed / seconds),
        "mb_per_s": round(landed * work.size / common.MB / seconds, 1),
        "cpu_s": round(stats.cpu_s, 2),
        "broker_cpu_s": round(broker_cpu, 2),
        "outside_cpu_share": stats.outside_share(broker_cpu),
        "peak_rss_mb": round(stats.peak_rss_mb, 1),
        "peak_anon_mb": round(stats.peak_anon_mb, 1),
        **fetch_figures(scraper.last),
        **sizes,
    }


def idle_rss(
    tansu: Tansu | KafkaBroker,
    topic: str,
    workdir: Path,
    group: str,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
    seconds: float,
) -> dict[str, Any]:
    """The RSS of a daemon on ``group``'s state (its offset file at the log end: nothing to fetch)
    over ``seconds`` after its first fetch: the baseline the burst runs' peak RSS is measured
    against; its anonymous part (RssAnon) beside it."""
    import psutil

    from mqd.waiting import wait_until_sync

    cfg = daemon_config(
        workdir / f"mqd-idle-{group}.toml",
        tansu.bootstrap,
        topic=topic,
        group=group,
        landing=workdir / "landing-idle",
        max_records=max_records,
        max_bytes=max_bytes,
        max_age=max_age,
        compression=compression,
    )
    proc = WatchedProcess(argv(cfg, burst=False), log_path=workdir / "mqd-idle.log", cwd=workdir)
    proc.start()
    try:
        wait_until_sync(
            lambda: common.log_event_time(proc.log_path, "first fetch sent") is not None,
            timeout,
            "the idle daemon's first fetch",
            interval=0.05,
        )
        assert proc.pid is not None
        p = psutil.Process(proc.pid)
        rss: list[float] = []
        anon: list[float] = []
        status = Path(f"/proc/{proc.pid}/status")
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            rss.append(p.memory_info().rss / 2**20)
            a = common._status_mb(status)[1]
            if a is not None:
                anon.append(a)
            time.sleep(0.25)
    finally:
        proc.terminate(timeout=30)
    return {
        "seconds": seconds,
        "rss_mb": round(max(rss), 1),
        "rss_mb_min": round(min(rss), 1),
        "anon_mb": round(max(anon), 1) if anon else None,
    }


def cluster_join_startup(
    tansu: Tansu | KafkaBroker,
    topic: str,
    workdir: Path,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
) -> dict[str, Any]:
    """Spawn to first fetch of a daemon in cluster mode with a fresh consumer group (the broker's
    join wait included); stopped right after."""
    from mqd.waiting import wait_until_sync

    group = "bench-kafka-cluster"
    cfg = daemon_config(
        workdir / "mqd-cluster.toml",
        tansu.bootstrap,
        topic=topic,
        group=group,
        landing=workdir / "landing-cluster",
        max_records=max_records,
        max_bytes=max_bytes,
        max_age=max_age,
        compression=compression,
        mode="cluster",
    )
    proc = WatchedProcess(argv(cfg, burst=False), log_path=workdir / "mqd-cluster.log", cwd=workdir)
    proc.start()
    try:
        wait_until_sync(
            lambda: common.log_event_time(proc.log_path, "first fetch sent") is not None,
            timeout,
            "the cluster-mode daemon's first fetch",
            interval=0.05,
        )
    finally:
        proc.terminate(timeout=30)
    shutil.rmtree(workdir / "landing-cluster", ignore_errors=True)
    first = common.log_event_time(proc.log_path, "first fetch sent")
    joined = common.log_event_time(proc.log_path, "consumer group joined")
    started = common.log_event_time(proc.log_path, "daemon started")
    return {
        "spawn_to_first_fetch_s": round(first - proc.started_at, 3) if first else None,
        "group_join_s": round(joined - started, 3) if joined and started else None,
    }
