"""Interleaved A/B runs of the daemon on one backlog: throughput and peak RSS per code tree.

One cluster and one backlog (the pipeline bench's workload), then rounds of daemon runs, round-robin over
the variants so a load burst from other processes hits every variant alike. A variant is a code
tree (a checkout of mqd; default this one) plus daemon config overrides; each run gets its own
consumer group and landing directory, so every run lands the whole backlog from offset 0.

    python -m bench.memab --records 2000000 --rounds 3 \\
        --variant base=/tmp/mqd-base --variant new=. \\
        --variant new96=.:consumer.max_buffered_bytes=100663296
    python -m bench.memab --memory ...   # the pipeline bench's memory run instead: slow sink, RSS only

Main run (default): ``mqd run --burst`` lands the backlog, timed like bench.py (records/s from
'daemon started' to exit) with the kernel's peak RSS. ``--memory``: the sink is throttled to
``--slow-sink-mbps`` (bench/slow_sink.py of the variant's tree) with ``max_buffered_bytes``
``--memory-buffer-mb`` and landing max_bytes 8 MiB, like bench.py; RSS peak over
``--memory-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import common
from bench import pipeline as _bench
from bench.common import WatchedProcess, Workload
from mqd.testing import LocalCluster

TOPIC = _bench.TOPIC


def parse_variant(spec: str) -> tuple[str, Path, dict[str, dict[str, Any]]]:
    """``name=tree[:section.key=value,...]``; section ``env`` sets the daemon's environment."""
    name, _, rest = spec.partition("=")
    tree, _, items = rest.partition(":")
    return name, Path(tree or ".").resolve(), common.parse_overrides(items)


def run_once(
    name: str,
    tree: Path,
    over: dict[str, dict[str, Any]],
    urls: list[str],
    workdir: Path,
    args: argparse.Namespace,
    n: int,
) -> dict[str, Any]:
    group = f"ab-{name}-{n}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-{group}"
    memory = args.memory
    cfg_path = _bench.daemon_config(
        workdir / f"{group}.toml",
        urls,
        topic=TOPIC,
        group=group,
        landing=landing,
        landing_max_records=500_000,
        landing_max_bytes=(8 if memory else 32) * 2**20,
        landing_max_age=5.0,
        compression="snappy",
        max_buffered_bytes=args.memory_buffer_mb * 2**20 if memory else None,
    )
    env = {"PYTHONPATH": str(tree), **{k: str(v) for k, v in over.get("env", {}).items()}}
    common.apply_overrides(cfg_path, over)
    slow_sink = [sys.executable, str(tree / "bench" / "slow_sink.py")]
    head = slow_sink if memory else [sys.executable, "-m", "mqd.operator.cli"]
    if memory:
        env["MQD_BENCH_SINK_BYTES_PER_S"] = str(args.slow_sink_mbps * 1e6)
    proc = WatchedProcess(
        [*head, "run", "--config", str(cfg_path), "--burst"],
        log_path=workdir / f"{group}.log",
        cwd=workdir,
        env=env,
        sample_interval=0.05,
    )
    proc.start()
    if memory:
        deadline = time.monotonic() + args.memory_seconds
        while time.monotonic() < deadline and proc.running:
            time.sleep(0.05)
        stats = proc.terminate(timeout=30)
        landed = _bench.LandedCounter(landing, TOPIC)()
        shutil.rmtree(landing, ignore_errors=True)  # a whole backlog per run: do not keep them all
        return {"variant": name, "peak_rss_mb": round(stats.peak_rss_mb, 1), "landed": landed}
    stats = proc.finish(args.timeout)
    if stats.exit_code != 0:
        # the work dir is removed on the way out: show the log's end here
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name}: exit {stats.exit_code}:\n{tail}")
    landed = _bench.LandedCounter(landing, TOPIC)()
    files = len(_bench.landed_files(landing, TOPIC))
    shutil.rmtree(landing, ignore_errors=True)
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    seconds = max(stats.ended_at - started, 1e-3)
    return {
        "variant": name,
        "records_per_s": round(landed / seconds),
        "records_per_s_whole_process": round(landed / stats.wall_s),
        "load": round(__import__("os").getloadavg()[0], 2),
        "peak_rss_mb": round(stats.peak_rss_mb, 1),
        "cpu_s": round(stats.cpu_s, 2),
        "landed": landed,
        "files": files,
    }


def run_rounds(
    workdir: Path,
    work: Workload,
    variants: list[tuple[str, Path, dict[str, dict[str, Any]]]],
    args: argparse.Namespace,
    results: list[dict[str, Any]],
) -> None:
    """One cluster and backlog in ``workdir``, then ``args.rounds`` rounds over the variants."""
    cluster = LocalCluster(
        workdir / "cluster",
        topics={TOPIC: work.partitions},
        groups=3,
        slaves=1,
        node_settings={"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000},
    )
    with cluster:
        urls = list(cluster.urls.values())
        asyncio.run(_bench.produce_workload(urls, TOPIC, work, 4))
        asyncio.run(_bench.wait_replicated(cluster, TOPIC, work.partitions))
        for r in range(args.rounds):
            for name, tree, over in variants:
                res = run_once(name, tree, over, urls, workdir, args, r)
                res["round"] = r
                results.append(res)
                print(json.dumps(res), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(res) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument(
        "--shape",
        default="main",
        help="value size, partitions and skew of a bench/shapes.py shape (default main)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", required=True, help="name=tree[:section.key=value,...]")
    ap.add_argument("--memory", action="store_true", help="the memory run (slow sink) instead")
    ap.add_argument("--memory-seconds", type=float, default=30.0)
    ap.add_argument("--memory-buffer-mb", type=int, default=64)
    ap.add_argument("--slow-sink-mbps", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=None, help="JSON lines of every run")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    from bench.shapes import SHAPES

    shape = SHAPES[args.shape]
    work = Workload(args.records, shape.size, shape.partitions, 1000, hot=shape.hot)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-ab-") as tmp:
        run_rounds(Path(tmp), work, variants, args, results)
    print(
        "\nvariant | runs | records/s median (min..max) | whole process | peak RSS MB median (min..max)"
        " | paired ratio to the first variant (whole process)"
    )
    first = variants[0][0]
    base = {x["round"]: x for x in results if x["variant"] == first}
    for name, _, _ in variants:
        rows = [x for x in results if x["variant"] == name]
        rss = [x["peak_rss_mb"] for x in rows]
        cells = []
        for key in ("records_per_s", "records_per_s_whole_process"):
            v: list[int] = [x[key] for x in rows if x.get(key)]
            cells.append(f"{statistics.median(v):,.0f} ({min(v):,}..{max(v):,})" if v else "-")
        ratios = [
            x["records_per_s_whole_process"] / base[x["round"]]["records_per_s_whole_process"]
            for x in rows
            if x.get("records_per_s_whole_process") and x["round"] in base
        ]
        ratio = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})" if ratios else "-"
        print(
            f"{name} | {len(rows)} | {cells[0]} | {cells[1]} | {statistics.median(rss)} "
            f"({min(rss)}..{max(rss)}) | {ratio}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
