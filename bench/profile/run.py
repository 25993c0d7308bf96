"""Profile the daemon on a bench-sized backlog: one cluster, one backlog, several daemon runs.

Starts the bench's cluster (3 groups x master + slave, 127.0.0.1), produces ``--records`` records
once (the bench's workload: random values, round-robin over partitions), then runs ``probe.py``
once per variant, each with its own consumer group and landing directory, so every run lands the
whole backlog from offset 0. A variant changes daemon config keys::

    python bench/profile/run.py --records 500000 \\
        --variant base \\
        --variant big-fetch:consumer.partition_max_bytes=16777216 \\
        --variant nocomp:landing.compression=none \\
        --pyspy base                         # record this variant under py-spy too
    python bench/profile/run.py --consumer-only   # fetch + to_arrow alone, no sink

Output under ``--out`` (default bench/profile/out): ``<variant>.jsonl`` (memory samples + summary),
``<variant>.pyspy.txt`` (collapsed stacks) and ``<variant>.top.txt`` (hotspots, see collapse.py),
``summary.json`` with every variant's summary.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# bench/ (bench.py, common.py), this folder, the project, and tests/ (the harness's Cluster)
sys.path[:0] = [str(HERE.parent), str(HERE), str(HERE.parents[1]), str(HERE.parents[1] / "tests")]

import collapse  # noqa: E402
import common  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from common import WatchedProcess, Workload, log_event_time  # noqa: E402

from mqd.producer import Producer  # noqa: E402

# bench/bench.py (mypy would take the name for the bench/ folder)
_bench: Any = importlib.import_module("bench")
FileWatcher, LandedCounter = _bench.FileWatcher, _bench.LandedCounter
_produce_at_rate, produce_workload = _bench._produce_at_rate, _bench.produce_workload
from harness import Cluster, to_toml  # noqa: E402

TOPIC = "events"
LATENCY_TOPIC = "latency"
PYSPY = Path(sys.executable).parent / "py-spy"


def parse_variant(spec: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """``name[:section.key=value,...]`` -> (name, {section: {key: value}})."""
    name, _, rest = spec.partition(":")
    return name, common.parse_overrides(rest)


def write_config(
    path: Path, urls: list[str], group: str, landing: Path, over: dict[str, Any], topic: str = TOPIC
) -> Path:
    cfg: dict[str, Any] = {
        "consumer": {
            "group": group,
            "client_id": f"{group}-daemon",
            "bootstrap": urls,
            "topics": [topic],
            "consume_from": "first",
        },
        # the bench's landing settings (bench.py defaults)
        "landing": {
            "dir": str(landing),
            "max_records": 500_000,
            "max_bytes": 128 * 2**20,
            "max_age": 5.0,
            "compression": "snappy",
        },
        "admin": {"enabled": False},
        "log": {"level": "warning", "format": "json"},
        "daemon": {"state_dir": str(path.parent / f"state-{group}"), "watchdog": False},
    }
    for section, keys in over.items():
        cfg.setdefault(section, {}).update(keys)
    path.write_text(to_toml(cfg))
    return path


def run_cli(
    name: str, over: dict[str, Any], urls: list[str], workdir: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """``mqd run --burst`` as bench.py runs it and times it: from the 'daemon started' log line to
    the process's exit (so the stop, the final commit and the interpreter's exit count too), with
    the stop's own moments from the log ('burst complete', 'daemon stopped')."""
    group = f"cli-{name}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-cli-{name}"
    over = {k: v for k, v in over.items() if k != "probe"} | {"log": {"level": "info", "format": "json"}}
    cfg = write_config(workdir / f"cli-{name}.toml", urls, group, landing, over)
    log_path = out / f"{name}.cli.log"
    log_path.unlink(missing_ok=True)
    proc = WatchedProcess(
        [sys.executable, "-m", "mqd.cli", "run", "--config", str(cfg), "--burst"],
        log_path=log_path,
        cwd=workdir,
    )
    proc.start()
    st = proc.wait(args.timeout)
    if st.exit_code != 0:
        raise RuntimeError(f"{name}: mqd run exited {st.exit_code}; see {log_path}")
    started = log_event_time(log_path, "daemon started") or st.started_at
    burst = log_event_time(log_path, "burst complete")
    stopped = log_event_time(log_path, "daemon stopped")
    records = LandedCounter(landing, TOPIC)()
    shutil.rmtree(landing, ignore_errors=True)
    return {
        "variant": name,
        "mode": "cli",
        "records": records,
        "records_per_s": round(records / (st.ended_at - started)),
        "records_per_s_to_burst_complete": round(records / (burst - started)) if burst else None,
        "startup_s": round(started - st.started_at, 3),
        "work_s": round(burst - started, 3) if burst else None,
        "stop_s": round(stopped - burst, 3) if burst and stopped else None,
        "exit_s": round(st.ended_at - stopped, 3) if stopped else None,
        "cpu_s": st.cpu_s,
        "ru_maxrss_mb": round(st.peak_rss_mb, 1),
    }


def run_variant(
    name: str,
    over: dict[str, Any],
    urls: list[str],
    workdir: Path,
    out: Path,
    args: argparse.Namespace,
    *,
    pyspy: bool,
    mode: str,
) -> dict[str, Any]:
    group = f"prof-{name}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-{name}"
    over = dict(over)
    proto = over.pop("probe", {}).get("proto", "")
    env = {**os.environ, **{k: str(v) for k, v in over.pop("env", {}).items()}}  # e.g. MALLOC_* knobs
    cfg = write_config(workdir / f"{name}.toml", urls, group, landing, over)
    jsonl = out / f"{name}{'.pyspy' if pyspy else ''}.jsonl"
    argv = [
        sys.executable,
        str(HERE / "probe.py"),
        mode,
        "--config",
        str(cfg),
        "--out",
        str(jsonl),
        "--expect",
        str(args.records),
        "--timeout",
        str(args.timeout),
        "--proto",
        str(proto),
    ]
    stacks = out / f"{name}.pyspy.txt"
    if pyspy:
        argv = [
            str(PYSPY),
            "record",
            "--rate",
            str(args.pyspy_rate),
            "--format",
            "raw",
            "--threads",
            *(["--native"] if args.native else ["--nonblocking"]),
            "-o",
            str(stacks),
            "--",
            *argv,
        ]
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=workdir, timeout=args.timeout + 60, capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    summary: dict[str, Any] = {}
    for line in jsonl.read_text().splitlines():
        row = json.loads(line)
        if "summary" in row:
            summary = row["summary"]
    summary.update(variant=name, overrides=over, process_wall_s=round(wall, 2), pyspy=pyspy)
    if pyspy:
        top = collapse.report(stacks, limit=args.top)
        (out / f"{name}.top.txt").write_text(top)
        print(top)
    shutil.rmtree(landing, ignore_errors=True)
    return summary


def _median(xs: list[float]) -> float | None:
    return round(float(np.median(xs)), 3) if xs else None


def _wait(cond: Any, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_live(
    name: str, over: dict[str, Any], urls: list[str], workdir: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The bench's latency run (warm-up, then ``--rate`` records/s for ``--seconds``, produce
    timestamp vs first time the file is seen) against probe.py's live mode, which also logs every
    flush of the sink: how old the buffers were and how long the flush held the working loop."""
    group = f"lat-{name}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-lat-{name}"
    # consume_from last: earlier variants' records stay behind (the latency topic is shared)
    over = {
        **over,
        "landing": {"max_age": 1.0, **over.get("landing", {})},
        "consumer": {"consume_from": "last", **over.get("consumer", {})},
    }
    proto = over.pop("probe", {}).get("proto", "")
    cfg = write_config(workdir / f"lat-{name}.toml", urls, group, landing, over, topic=LATENCY_TOPIC)
    jsonl = out / f"{name}.live.jsonl"
    stop = workdir / f"stop-{name}"
    argv = [
        sys.executable,
        str(HERE / "probe.py"),
        "live",
        "--config",
        str(cfg),
        "--out",
        str(jsonl),
        "--stop-file",
        str(stop),
        "--proto",
        str(proto),
    ]
    proc = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watcher = FileWatcher(landing, LATENCY_TOPIC, interval=0.01)
    landed = LandedCounter(landing, LATENCY_TOPIC)
    watcher.start()
    try:

        async def warm() -> None:
            async with Producer(urls) as producer:
                for p in range(args.partitions):
                    await producer.send_batch(LATENCY_TOPIC, p, [b"warm-up"])

        # warm up until the daemon owns every partition: one record per partition, landed
        for _ in range(30):
            asyncio.run(warm())
            try:
                _wait(lambda: landed() >= args.partitions, 3, "warm-up records", proc)
                break
            except TimeoutError:
                continue
        before = landed()
        watcher.poll()
        old = set(watcher.seen)
        sent, produce_s = asyncio.run(
            _produce_at_rate(urls, LATENCY_TOPIC, args.partitions, args.rate, args.seconds, args.size)
        )
        _wait(lambda: landed() >= before + sent, 60, "every record landed", proc)
        watcher.poll()
    finally:
        watcher.stop()
        stop.touch()
        proc.wait(60)
    lat = []
    for f, seen in watcher.seen.items():
        if f not in old:
            ts = pq.read_table(f, columns=["timestamp"]).column("timestamp").cast("int64").to_numpy()
            lat.append(seen * 1000 - ts)
    ms = np.concatenate(lat)
    summary: dict[str, Any] = {}
    for line in jsonl.read_text().splitlines():
        row = json.loads(line)
        if "summary" in row:
            summary = row["summary"]
    flushes = [f for f in summary.get("flushes", []) if f["records"]]
    shutil.rmtree(landing, ignore_errors=True)
    return {
        "variant": name,
        "overrides": over,
        "rate": round(sent / produce_s),
        "records": int(ms.size),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p99_ms": round(float(np.percentile(ms, 99)), 1),
        "max_ms": round(float(ms.max()), 1),
        "flushes": len(flushes),
        "flush_seconds_mean": round(float(np.mean([f["seconds"] for f in flushes])), 3) if flushes else None,
        "flush_seconds_max": max((f["seconds"] for f in flushes), default=None),
        "flush_partitions_mean": _median([f["partitions"] for f in flushes]),
        "flush_oldest_age_max_s": max((f["oldest_age_s"] or 0 for f in flushes), default=None),
        "flush_oldest_record_age_p50_s": _median([f["oldest_record_age_s"] or 0 for f in flushes]),
        "flush_sample": flushes[len(flushes) // 2 : len(flushes) // 2 + 4],
        "timers": summary.get("timers"),
        "loop_lag_ms": summary.get("loop_lag_ms"),
    }


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def table(results: list[dict[str, Any]]) -> str:
    """Median records/s, CPU and peak RSS per variant (runs named ``name-i``)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.get("pyspy"):
            continue
        base = r["variant"].rsplit("-", 1)[0] if r["variant"].rsplit("-", 1)[-1].isdigit() else r["variant"]
        by.setdefault(base, []).append(r)
    lines = [
        "| variant | runs | records/s (median) | min..max | daemon CPU s | broker CPU s | peak RSS MB |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, rs in by.items():
        rps = sorted(r["records_per_s"] for r in rs)
        lines.append(
            f"| {name} | {len(rs)} | {int(np.median(rps)):,} | {rps[0]:,}..{rps[-1]:,} | "
            f"{np.median([r['cpu_s'] for r in rs]):.2f} | "
            f"{np.median([r.get('broker_cpu_s', 0) for r in rs]):.2f} | "
            f"{np.median([r.get('ru_maxrss_mb') or r.get('peak_rss_mb') or 0 for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--slaves", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[], help="name[:section.key=value,...]")
    ap.add_argument("--pyspy", action="append", default=[], help="variant names to record with py-spy")
    ap.add_argument("--pyspy-rate", type=int, default=200)
    ap.add_argument("--native", action="store_true", help="py-spy --native (C frames of pyarrow too)")
    ap.add_argument("--consumer-only", action="store_true", help="run the consumer alone (no sink)")
    ap.add_argument(
        "--cli",
        action="append",
        default=[],
        help="variant names to also run as `mqd run --burst`, timed like bench.py",
    )
    ap.add_argument(
        "--consumer",
        action="append",
        default=[],
        help="variant names to run a second time as the consumer alone (no sink)",
    )
    ap.add_argument("--live", action="store_true", help="latency run per variant instead of the backlog")
    ap.add_argument("--rate", type=float, default=50_000.0, help="--live: records/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="--live: produce this long")
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant (throughput is noisy)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ["base"])]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Workload(args.records, args.size, args.partitions, 1000)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-prof-") as tmp:
        workdir = Path(tmp)
        cluster = Cluster(
            workdir / "cluster",
            topics={TOPIC: args.partitions, LATENCY_TOPIC: args.partitions},
            groups=args.groups,
            slaves=args.slaves,
            node_settings={"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000},
        )
        with cluster:
            urls = list(cluster.urls.values())
            if args.live:
                for name, over in variants:
                    r = run_live(name, over, urls, workdir, args.out, args)
                    results.append(r)
                    print(json.dumps(r), flush=True)
                path = args.out / f"live-{time.strftime('%H%M%S')}.json"
                path.write_text(json.dumps(results, indent=1))
                print(f"written {path}")
                return 0
            prod = asyncio.run(produce_workload(urls, TOPIC, work, 4))
            print(f"produced {args.records:,} records at {prod['records_per_s']:,}/s", flush=True)
            mode = "consumer" if args.consumer_only else "daemon"
            brokers = psutil.Process().children(recursive=True)
            # interleaved (round-robin) so a burst of load from elsewhere hits every variant alike
            for i in range(args.repeat):
                for name, over in variants:
                    for pyspy in [False, True] if name in args.pyspy and i == 0 else [False]:
                        cpu0 = _cpu(brokers)
                        s = run_variant(
                            f"{name}" if args.repeat == 1 else f"{name}-{i}",
                            over,
                            urls,
                            workdir,
                            args.out,
                            args,
                            pyspy=pyspy,
                            mode=mode,
                        )
                        s["broker_cpu_s"] = round(_cpu(brokers) - cpu0, 2)
                        results.append(s)
                        if name in args.cli and not pyspy:
                            c = run_cli(f"{name}.cli-{i}", over, urls, workdir, args.out, args)
                            results.append(c)
                            print(json.dumps(c), flush=True)
                        if name in args.consumer and not pyspy:
                            cpu0 = _cpu(brokers)
                            c = run_variant(
                                f"{name}-consumer",
                                over,
                                urls,
                                workdir,
                                args.out,
                                args,
                                pyspy=False,
                                mode="consumer",
                            )
                            c["broker_cpu_s"] = round(_cpu(brokers) - cpu0, 2)
                            results.append(c)
                            print(json.dumps(c), flush=True)
                        keys = (
                            "records",
                            "records_per_s",
                            "cpu_s",
                            "broker_cpu_s",
                            "ru_maxrss_mb",
                            "peak",
                            "thread_cpu_s",
                            "timers",
                            "loop_lag_ms",
                            "fetch_requests",
                            "files",
                        )
                        print(
                            json.dumps(
                                {"variant": s["variant"], "pyspy": pyspy, **{k: s.get(k) for k in keys}}
                            ),
                            flush=True,
                        )
    print(table(results))
    stem = "consumer" if args.consumer_only else "summary"
    path = args.out / f"{stem}-{time.strftime('%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
