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

A burst commits once, so most of that difference is a fixed cost per run (importing deltalake,
creating the table, its first load). With two sizes or more, the paired differences in CPU-s are
fitted against the run size (least squares over every round): the slope is the **marginal** cost
per million records (what the table costs per record; the fixed part cancels), the intercept the
**fixed** cost per run; the slope of the runs without the table is the daemon's own marginal CPU,
so slope / slope is the marginal share.

**Steady state** (``--steady-rate``, ``--steady-seconds``): a running daemon (``mqd run``, not a
burst; ``landing.max_age`` 5 s, the default ``commit_interval`` of 5 s) fed at a fixed rate the way
bench/pipeline.py's latency shape feeds it (``_produce_at_rate``), without and with the table,
interleaved. The daemon's CPU is read from /proc at the start of producing and again once every
record has landed plus ``commit_interval`` + 1 s (the same wait for both variants): start-up, the
table's creation and the deltalake import (a warm-up record per partition, landed and committed
before) and the stop are outside the window. Per run: CPU-s per million records; summary: the
paired difference and its share.

Every run waits for a 1-minute load average of at most ``--max-load`` (1.5; polled every 60 s for
up to 30 minutes in all, then measured anyway) and records the load it started at.

    python -m bench.landing_table_cost                          # 1,000,000 and 4,000,000 records, 3 rounds
    python -m bench.landing_table_cost --sizes 200000,800000 --rounds 2 --steady-seconds 10
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
from mqd.wire.producer import Producer

RESULTS = Path(__file__).resolve().parent / "results"
PARTITIONS = 12
VALUE_SIZE = 100
VARIANTS = ("none", "delta")
CLUSTER_START_TIMEOUT = 180.0  # six broker processes starting at once on a loaded machine
STEADY_MAX_AGE = 5.0  # landing.max_age of the steady runs: 12 files every 5 s, a commit every 5 s
COMMIT_INTERVAL = 5.0  # [landing.delta] commit_interval's default


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


def variant_config(
    workdir: Path,
    urls: list[str],
    topic: str,
    group: str,
    variant: str,
    max_records: int,
    max_bytes: int,
    max_age: float,
) -> Path:
    """The daemon's config file for one run: its own group and landing (``landing-<group>``), the
    table on for the ``delta`` variant."""
    cfg = _bench.daemon_config(
        workdir / f"{group}.toml",
        urls,
        topic=topic,
        group=group,
        landing=workdir / f"landing-{group}",
        landing_max_records=max_records,
        landing_max_bytes=max_bytes,
        landing_max_age=max_age,
        compression="snappy",
    )
    if variant == "delta":
        common.apply_overrides(cfg, {"landing": {"table": "delta"}})
    return cfg


def run_once(
    urls: list[str], topic: str, records: int, variant: str, workdir: Path, timeout: float, file_records: int
) -> dict[str, Any]:
    group = f"lt-{variant}-{records}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-{group}"
    cfg = variant_config(workdir, urls, topic, group, variant, file_records, 32 * 2**20, 5.0)
    load = common.wait_quiet()
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


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y against x."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def marginal(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The burst runs' CPU-s against their size: the table's marginal cost per million records
    (the slope of the paired differences) and its fixed cost per run (their intercept), next to the
    daemon's own marginal CPU (the slope of the runs without the table)."""
    by = {(r["round"], r["records"], r["variant"]): r for r in results}
    diffs, base = [], []
    for (n, size, variant), r in by.items():
        if variant != "delta" or (n, size, "none") not in by:
            continue
        none = by[(n, size, "none")]
        diffs.append((size / 1e6, r["cpu_s"] - none["cpu_s"]))
        base.append((size / 1e6, none["cpu_s"]))
    if len({x for x, _ in diffs}) < 2:
        return None
    slope, fixed = _fit(diffs)
    base_slope, base_fixed = _fit(base)
    return {
        "pairs": len(diffs),
        "marginal_cpu_s_per_million": round(slope, 3),
        "fixed_cpu_s_per_run": round(fixed, 3),
        "none_marginal_cpu_s_per_million": round(base_slope, 3),
        "none_fixed_cpu_s_per_run": round(base_fixed, 3),
        "marginal_percent": round(slope / base_slope * 100, 1) if base_slope > 0 else None,
    }


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steady_once(
    cluster: LocalCluster,
    topic: str,
    variant: str,
    workdir: Path,
    rate: float,
    seconds: float,
    timeout: float,
) -> dict[str, Any]:
    """One steady run (module docstring): the daemon's CPU while ``rate`` records/s for ``seconds``
    land, plus the same settling wait for both variants."""
    urls = list(cluster.urls.values())
    group = f"lts-{variant}-{int(time.time() * 1000) % 10**8}"
    landing = workdir / f"landing-{group}"
    cfg = variant_config(workdir, urls, topic, group, variant, 5_000_000, 128 * 2**20, STEADY_MAX_AGE)
    load = common.wait_quiet()
    proc = WatchedProcess(
        _bench.daemon_argv(cfg, burst=False), log_path=workdir / f"{group}.log", cwd=workdir
    )
    landed = _bench.LandedCounter(landing, topic)
    proc.start()
    try:

        async def warm() -> None:
            async with Producer(urls) as producer:
                for p in range(PARTITIONS):
                    await producer.send_batch(topic, p, [b"warm-up"])

        asyncio.run(warm())
        deadline = time.monotonic() + timeout
        while landed() < PARTITIONS:  # the group owns and fetches every partition
            if not proc.running or time.monotonic() > deadline:
                raise RuntimeError(f"steady {variant}: warm-up not landed; see {proc.log_path}")
            time.sleep(0.2)
        if variant == "delta":  # the table created and the warm-up committed: fixed costs done
            first = landing / "_delta_log" / f"{1:020d}.json"
            while not first.exists():
                if not proc.running or time.monotonic() > deadline:
                    raise RuntimeError(f"steady delta: no first commit; see {proc.log_path}")
                time.sleep(0.2)
        time.sleep(1.0)
        assert proc.pid is not None
        cpu0, wall0 = proc_cpu_s(proc.pid), time.monotonic()
        sent, produce_s = asyncio.run(
            _bench._produce_at_rate(urls, topic, PARTITIONS, rate, seconds, VALUE_SIZE)
        )
        while landed() < PARTITIONS + sent:
            if not proc.running or time.monotonic() > deadline:
                raise RuntimeError(f"steady {variant}: landed {landed()} of {PARTITIONS + sent}")
            time.sleep(0.1)
        landed_at = time.monotonic()
        time.sleep(COMMIT_INTERVAL + 1.0)
        cpu1, wall1 = proc_cpu_s(proc.pid), time.monotonic()
    finally:
        stats = proc.terminate(timeout=60)
    out: dict[str, Any] = {
        "variant": variant,
        "rate": rate,
        "seconds": seconds,
        "records": sent,
        "achieved_rate": round(sent / produce_s) if produce_s > 0 else None,
        "load": load,
        "load_after": round(os.getloadavg()[0], 2),
        "window_cpu_s": round(cpu1 - cpu0, 3),
        "window_wall_s": round(wall1 - wall0, 2),
        "landed_after_s": round(landed_at - wall0, 2),
        "cpu_s_per_million": round((cpu1 - cpu0) / sent * 1e6, 3),
        "run_cpu_s": round(stats.cpu_s, 2),
        "files": len(_bench.landed_files(landing, topic)),
    }
    if variant == "delta":
        in_table, table_files, version = table_records(landing)
        if in_table != PARTITIONS + sent:
            raise RuntimeError(f"steady delta: the table holds {in_table} of {PARTITIONS + sent} records")
        out.update(log_files=table_files, log_version=version, **stopped_stats(proc.log_path))
    shutil.rmtree(landing, ignore_errors=True)
    return out


def steady_summary(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    by = {(r["round"], r["variant"]): r for r in runs}
    pairs = [(by[(n, "delta")], by[(n, "none")]) for n, v in by if v == "none" and (n, "delta") in by]
    if not pairs:
        return None
    diffs = [d["cpu_s_per_million"] - b["cpu_s_per_million"] for d, b in pairs]
    shares = [x / b["cpu_s_per_million"] * 100 for x, (_, b) in zip(diffs, pairs, strict=True)]
    return {
        "rounds": len(pairs),
        "rate": pairs[0][0]["rate"],
        "seconds": pairs[0][0]["seconds"],
        "none_cpu_s_per_million": round(statistics.median(b["cpu_s_per_million"] for _, b in pairs), 3),
        "delta_cpu_s_per_million": round(statistics.median(d["cpu_s_per_million"] for d, _ in pairs), 3),
        "diff_cpu_s_per_million": round(statistics.median(diffs), 3),
        "diff_min_max": [round(min(diffs), 3), round(max(diffs), 3)],
        "diff_percent": round(statistics.median(shares), 1),
        "diff_percent_min_max": [round(min(shares), 1), round(max(shares), 1)],
        "loads": sorted({r["load"] for pair in pairs for r in pair}),
    }


def markdown_extra(fit: dict[str, Any] | None, steady: dict[str, Any] | None) -> str:
    lines = []
    if fit:
        lines += [
            "",
            "| burst runs fitted against size | pairs | table: marginal CPU-s per M records "
            "| table: fixed CPU-s per run | daemon without the table: marginal CPU-s per M "
            "(fixed per run) | marginal share |",
            "|---|---|---|---|---|---|",
            f"| least squares | {fit['pairs']} | {fit['marginal_cpu_s_per_million']} "
            f"| {fit['fixed_cpu_s_per_run']} "
            f"| {fit['none_marginal_cpu_s_per_million']} ({fit['none_fixed_cpu_s_per_run']}) "
            f"| {fit['marginal_percent']} % |",
        ]
    if steady:
        s = steady
        lines += [
            "",
            "| steady run | rounds | CPU-s / M records, no table | with the table | difference (paired) "
            "| share of the daemon's CPU | load averages |",
            "|---|---|---|---|---|---|---|",
            f"| {s['rate']:,.0f} records/s for {s['seconds']:g} s | {s['rounds']} "
            f"| {s['none_cpu_s_per_million']} "
            f"| {s['delta_cpu_s_per_million']} | {s['diff_cpu_s_per_million']} "
            f"[{s['diff_min_max'][0]}..{s['diff_min_max'][1]}] | {s['diff_percent']} % "
            f"[{s['diff_percent_min_max'][0]}..{s['diff_percent_min_max'][1]}] "
            f"| {', '.join(str(x) for x in s['loads'])} |",
        ]
    return "\n".join(lines)


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
    ap.add_argument(
        "--steady-rate", type=float, default=50_000.0, help="records/s of the steady runs (0: none)"
    )
    ap.add_argument(
        "--steady-seconds",
        type=float,
        default=None,
        help="seconds of producing per steady run (default 30, at most twice the largest size's records)",
    )
    common.add_quiet_args(ap)
    ap.add_argument("--out", type=Path, default=RESULTS / "landing_table_cost.json")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    common.apply_quiet_args(args)
    steady_s = args.steady_seconds
    if steady_s is None:
        steady_s = min(30.0, 2 * max(sizes) / args.steady_rate) if args.steady_rate > 0 else 0.0
    topics = {f"lt{size}": size for size in sizes}
    steady_topics = (
        [f"ltsteady-{n}-{v}" for n in range(args.rounds) for v in VARIANTS] if steady_s > 0 else []
    )
    steady_runs: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-lt-") as tmp:
        workdir = Path(tmp)
        cluster = LocalCluster(
            workdir / "cluster",
            topics=dict.fromkeys([*topics, *steady_topics], PARTITIONS),  # a fresh topic per steady run
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
                if steady_s > 0:
                    for variant in order:
                        res = steady_once(
                            cluster,
                            f"ltsteady-{n}-{variant}",
                            variant,
                            workdir,
                            args.steady_rate,
                            steady_s,
                            args.timeout,
                        )
                        res["round"] = n
                        steady_runs.append(res)
                        print(json.dumps(res), flush=True)
        finally:
            cluster.stop()
    rows = summarize(results, sizes)
    fit = marginal(results)
    steady = steady_summary(steady_runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": common.machine_facts(),
        "rows": rows,
        "marginal": fit,
        "steady": steady,
        "runs": results,
        "steady_runs": steady_runs,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(rows) + "\n" + markdown_extra(fit, steady)
    args.out.with_suffix(".md").write_text(md + "\n")
    print("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
