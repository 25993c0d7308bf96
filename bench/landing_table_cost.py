"""``python -m bench.landing_table_cost``: what ``landing.table = "delta"`` costs the daemon (issue 35;
target: at most 5 % of the daemon's CPU).

One cluster (3 broker groups with a slave each, like bench/memab.py) holding one backlog per run size
(a topic each), then rounds: in each round, every size is landed by ``mqd run --burst`` once
without the landing table and once with it (the order alternating from round to round, so a burst of
load from elsewhere hits both alike); each run has its own consumer group and landing, so it lands
its whole backlog from offset 0 and, with the table, commits it before it exits. Measured per run:
the daemon's CPU seconds (the kernel's rusage of the process, start-up included) per million
records landed, and the load average before it. A table run must hold every landed record in its
table (the ``add`` actions' ``numRecords``), else the run fails.

Summary per size: the median CPU-s per million records of each variant, and the committer's cost as
the paired difference (table run minus the run without it, round by round) in CPU-s per million
records and as a share of the run without the table.

    python -m bench.landing_table_cost                          # 1,000,000 and 4,000,000 records, 3 rounds
    python -m bench.landing_table_cost --sizes 200000,800000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 12
VALUE_SIZE = 100
VARIANTS = ("none", "delta")
CLUSTER_START_TIMEOUT = 180.0  # six broker processes starting at once on a loaded machine


def table_records(landing: Path) -> tuple[int, int, int | None]:
    """(records, files, version) of the landing table as its log lists them."""
    from deltalake import DeltaTable

    table = DeltaTable(str(landing))
    adds = table.get_add_actions(flatten=True)
    records = sum(int(n or 0) for n in adds.column("num_records").to_pylist())
    return records, len(adds), table.version()


def stopped_stats(log_path: Path) -> dict[str, Any]:
    """The ``daemon stopped`` line's table counters (commits, files, dropped, errors)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        if "daemon stopped" not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            return {k: v for k, v in entry.items() if k.startswith("table_")}
    return {}


def run_once(
    urls: list[str], topic: str, records: int, variant: str, workdir: Path, timeout: float, file_records: int
) -> dict[str, Any]:
    group = f"lt-{variant}-{records}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-{group}"
    cfg = _bench.daemon_config(
        workdir / f"{group}.toml",
        urls,
        topic=topic,
        group=group,
        landing=landing,
        landing_max_records=file_records,
        landing_max_bytes=32 * 2**20,
        landing_max_age=5.0,
        compression="snappy",
    )
    if variant == "delta":
        common.apply_overrides(cfg, {"landing": {"table": "delta"}})
    load = round(os.getloadavg()[0], 1)
    proc = WatchedProcess(
        _bench.daemon_argv(cfg, burst=True),
        log_path=workdir / f"{group}.log",
        cwd=workdir,
        sample_interval=0.2,
    )
    proc.start()
    stats = proc.finish(timeout)
    if stats.exit_code != 0:
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{variant} {records}: exit {stats.exit_code}:\n{tail}")
    landed = _bench.LandedCounter(landing, topic)()
    if landed != records:
        raise RuntimeError(f"{variant} {records}: landed {landed} records")
    out: dict[str, Any] = {
        "variant": variant,
        "records": records,
        "load": load,
        "cpu_s": round(stats.cpu_s, 3),
        "wall_s": round(stats.wall_s, 2),
        "cpu_s_per_million": round(stats.cpu_s / landed * 1e6, 3),
        "files": len(_bench.landed_files(landing, topic)),
    }
    if variant == "delta":
        in_table, table_files, version = table_records(landing)
        if in_table != landed:
            raise RuntimeError(f"delta {records}: the landing table holds {in_table} of {landed} records")
        out.update(log_files=table_files, log_version=version, **stopped_stats(proc.log_path))
    shutil.rmtree(landing, ignore_errors=True)
    return out


def summarize(results: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        runs = {
            v: {r["round"]: r for r in results if r["records"] == size and r["variant"] == v}
            for v in VARIANTS
        }
        med = {v: statistics.median(r["cpu_s_per_million"] for r in runs[v].values()) for v in VARIANTS}
        paired = [
            (runs["delta"][n]["cpu_s_per_million"] - runs["none"][n]["cpu_s_per_million"], runs["none"][n])
            for n in sorted(set(runs["delta"]) & set(runs["none"]))
        ]
        diffs = [d for d, _ in paired]
        shares = [d / base["cpu_s_per_million"] * 100 for d, base in paired]
        rows.append(
            {
                "records": size,
                "rounds": len(paired),
                "none_cpu_s_per_million": round(med["none"], 2),
                "delta_cpu_s_per_million": round(med["delta"], 2),
                "diff_cpu_s_per_million": round(statistics.median(diffs), 2),
                "diff_min_max": [round(min(diffs), 2), round(max(diffs), 2)],
                "diff_percent": round(statistics.median(shares), 1),
                "diff_percent_min_max": [round(min(shares), 1), round(max(shares), 1)],
                "loads": sorted({r["load"] for v in VARIANTS for r in runs[v].values()}),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| records | rounds | CPU-s / M records, no table | with landing.table = delta | difference (paired) "
        "| share of the daemon's CPU | load averages |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['records']:,} | {r['rounds']} | {r['none_cpu_s_per_million']} "
            f"| {r['delta_cpu_s_per_million']} "
            f"| {r['diff_cpu_s_per_million']} [{r['diff_min_max'][0]}..{r['diff_min_max'][1]}] "
            f"| {r['diff_percent']} % [{r['diff_percent_min_max'][0]}..{r['diff_percent_min_max'][1]}] "
            f"| {', '.join(str(x) for x in r['loads'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,4000000", help="records of each run size, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--file-records",
        type=int,
        default=50_000,
        help="landing.max_records: records per landed file (the committer's work is per file)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one daemon run may take")
    ap.add_argument("--out", type=Path, default=RESULTS / "landing_table_cost.json")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    topics = {f"lt{size}": size for size in sizes}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-lt-") as tmp:
        workdir = Path(tmp)
        cluster = LocalCluster(
            workdir / "cluster",
            topics=dict.fromkeys(topics, PARTITIONS),
            groups=3,
            slaves=1,
            node_settings={"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000},
        )
        cluster.start(timeout=CLUSTER_START_TIMEOUT)
        try:
            urls = list(cluster.urls.values())
            for topic, size in topics.items():
                asyncio.run(
                    _bench.produce_workload(urls, topic, Workload(size, VALUE_SIZE, PARTITIONS, 1000), 4)
                )
                asyncio.run(_bench.wait_replicated(cluster, topic, PARTITIONS))
            for n in range(args.rounds):
                order = VARIANTS if n % 2 == 0 else VARIANTS[::-1]
                for topic, size in topics.items():
                    for variant in order:
                        res = run_once(urls, topic, size, variant, workdir, args.timeout, args.file_records)
                        res["round"] = n
                        results.append(res)
                        print(json.dumps(res), flush=True)
        finally:
            cluster.stop()
    rows = summarize(results, sizes)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": common.machine_facts(), "rows": rows, "runs": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(rows) + "\n")
    print("\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
