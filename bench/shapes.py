"""The shapes of issue 16 (``python -m bench --shape NAME``, ``make bench SHAPES=...``): mqd against the
best alternatives, interleaved, on each shape of data that matters.

Throughput shapes (``main``, ``wide``, ``kib``, ``hot``): one broker cluster (3 groups x master +
slave) and one Tansu broker get the same records; then ``--rounds`` rounds, each running every
pipeline once (mqd's ``mqd run --burst``, the confluent-kafka and aiokafka consumers of
bench/alt_consumer.py), the order rotated from round to round so a load burst from elsewhere hits
every pipeline alike. Every run is a process of its own, timed from spawn to exit (the headline:
start-up included, like for like) and from its consumer being up to exit (the steady rate);
its CPU seconds come from the kernel, the brokers' from /proc over the run; its files are checked
for exactness (every offset of every partition exactly once; mqd also its committed offsets).
Summaries are medians with [min-max] and the per-round (paired) ratios mqd / alternative.

``latency``: a running daemon (landing max_age 1 s) while records are produced at a fixed rate
(50k and 200k records/s for 20 s): produce-to-visible p50, p99, max.

``scale``: 1,000 partitions on 3 groups: the backlog's throughput (burst), then a running daemon
with nothing to do: its CPU and RSS over 30 s and its fetch requests per round.

Record counts are sized by duration: at least 5 s of consuming at the target rate (3x the
alternative). Each throughput shape and ``kafka`` also run at a smaller backlog (2M records, 500k
for ``kib``): mqd pays a fixed cost per run the clients do not, so the ratio is reported at both
sizes (issue 34). ``--quick`` divides them by 100 and runs one round (a smoke check, seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import alt_kafka, common, kafka_shape
from bench import pipeline as pl
from bench.common import WatchedProcess, Workload, check_exact, process_cpu_seconds
from mqd.landing.layout import parse_file_name
from mqd.testing import LocalCluster
from mqd.testing.tansu import Tansu
from mqd.waiting import wait_until_sync

TOPIC = pl.TOPIC
MAX_RECORDS = 500_000  # landing.max_records of every pipeline
MAX_BYTES = 32 * 2**20  # landing.max_bytes (the daemon's default)
MAX_AGE = 5.0
COMPRESSION = "snappy"
NODE_SETTINGS = {"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000}


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    kind: str  # "throughput", "kafka", "latency" or "scale"
    what: str
    records: int = 0
    size: int = 100
    partitions: int = 12
    hot: float = 0.0  # share of the records on partition 0
    # a smaller backlog the shape also runs at (issue 34): a ratio depends on the run's size, since
    # mqd pays a fixed cost per run that the client pipelines do not (bench/fixed_cost.py)
    smaller: int | None = None

    def sizes(self) -> list[Shape]:
        """The shape at each of its sizes, the smaller first."""
        if self.smaller is None:
            return [self]
        return [replace(self, records=self.smaller, smaller=None), replace(self, smaller=None)]


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("main", "throughput", "100 B x 12 partitions", 6_000_000, smaller=2_000_000),
        Shape("wide", "throughput", "100 B x 48 partitions", 6_000_000, partitions=48, smaller=2_000_000),
        Shape("kib", "throughput", "1 KiB x 12 partitions", 1_200_000, size=1024, smaller=500_000),
        Shape(
            "hot",
            "throughput",
            "100 B x 12 partitions, one holds 90 %",
            6_000_000,
            hot=0.9,
            smaller=2_000_000,
        ),
        Shape(
            "kafka",
            "kafka",
            "100 B x 12 partitions, every pipeline reads Tansu",
            6_000_000,
            smaller=2_000_000,
        ),
        Shape("latency", "latency", "fixed produce rate, 12 partitions, max_age 1 s"),
        Shape("scale", "scale", "100 B x 1,000 partitions", 2_000_000, partitions=1000),
    )
}


def log(msg: str) -> None:
    print(msg, flush=True)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def spread(values: list[float], digits: int = 0) -> dict[str, float] | None:
    """median, min and max of ``values`` (None when empty)."""
    if not values:
        return None
    r = (lambda v: round(v, digits)) if digits else (lambda v: float(round(v)))
    return {"median": r(statistics.median(values)), "min": r(min(values)), "max": r(max(values))}


# ---------------------------------------------------------------------------------------------
# one mqd run


def file_sizes(files: list[Path]) -> dict[str, Any]:
    """Sizes of the landed files; ``burst_share``: files of at least half of landing.max_bytes
    among those not cut by the end of the backlog (each partition's last file is)."""
    last: dict[int, tuple[int, Path]] = {}
    for f in files:
        parsed = parse_file_name(f.name)
        if parsed is not None:
            p, _, first = parsed
            if p not in last or first > last[p][0]:
                last[p] = (first, f)
    tails = {f for _, f in last.values()}
    sizes = [f.stat().st_size for f in files]
    inner = [f.stat().st_size for f in files if f not in tails]
    return {
        "files": len(files),
        "median_file_mb": round(statistics.median(sizes) / common.MB, 2) if sizes else None,
        "burst_share": round(sum(s >= MAX_BYTES / 2 for s in inner) / len(inner), 2) if inner else None,
    }


def run_mqd(
    cluster: LocalCluster, work: Workload, workdir: Path, tag: str, *, timeout: float, keep: bool = False
) -> dict[str, Any]:
    """One ``mqd run --burst`` over the whole topic (a fresh group and landing)."""
    urls = list(cluster.urls.values())
    group = f"bench-{tag}"
    landing = workdir / f"landing-mqd-{tag}"
    cfg = pl.daemon_config(
        workdir / f"mqd-{tag}.toml",
        urls,
        topic=TOPIC,
        group=group,
        landing=landing,
        landing_max_records=MAX_RECORDS,
        landing_max_bytes=MAX_BYTES,
        landing_max_age=MAX_AGE,
        compression=COMPRESSION,
    )
    client_id = f"{group}-daemon"
    before = pl.fetch_counts(cluster, client_id)
    pids = [n.pid for n in cluster.nodes.values() if n.pid is not None]
    cpu0 = process_cpu_seconds(pids)
    proc = WatchedProcess(pl.daemon_argv(cfg, burst=True), log_path=workdir / f"mqd-{tag}.log", cwd=workdir)
    proc.start()
    stats = proc.finish(timeout)
    broker_cpu = process_cpu_seconds(pids) - cpu0
    if stats.exit_code != 0:
        return {"name": "mqd", "error": f"exit {stats.exit_code}; see {proc.log_path}"}
    after = pl.fetch_counts(cluster, client_id)
    requests = sum(after[n] - before.get(n, 0) for n in after)
    files = pl.landed_files(landing, TOPIC)
    wrong = check_exact(files, work.per_partition())
    committed = asyncio.run(pl.committed_total(urls, group))
    if wrong is None and committed != work.records:
        wrong = f"committed {committed} of {work.records}"
    landed = sum(work.per_partition()) if wrong is None else pl.LandedCounter(landing, TOPIC)()
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    first_fetch = common.log_event_time(proc.log_path, "first fetch sent")
    first_file = min((f.stat().st_mtime for f in files), default=None)
    sizes = file_sizes(files)
    if not keep:
        shutil.rmtree(landing, ignore_errors=True)  # a whole copy of the records per run
    seconds = max(stats.ended_at - started, 1e-3)
    return {
        "name": "mqd",
        "records": landed,
        "exact": wrong is None,
        "inexact": wrong,
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
        "fetch_requests": requests,
        "time_to_first_file_s": round(first_file - stats.started_at, 3) if first_file else None,
        **sizes,
    }


# ---------------------------------------------------------------------------------------------
# throughput shapes


def summarize(runs: list[dict[str, Any]], records: int, ceiling: dict[str, Any] | None) -> dict[str, Any]:
    """Per pipeline: medians [min-max]; per alternative: the paired ratios mqd / it, round by round."""
    out: dict[str, Any] = {}
    names = list(dict.fromkeys(r["name"] for r in runs))
    m = records / 1e6
    for name in names:
        ok = [r for r in runs if r["name"] == name and "error" not in r]
        out[name] = {
            "runs": len([r for r in runs if r["name"] == name]),
            "failed": len([r for r in runs if r["name"] == name and "error" in r]),
            "exact": all(r["exact"] for r in ok) and bool(ok),
            "whole": spread([r["records_per_s_whole_process"] for r in ok]),
            "steady": spread([r["records_per_s"] for r in ok]),
            "cpu_per_m": spread([r["cpu_s"] / m for r in ok], 2),
            "cpu_per_m_with_brokers": spread([(r["cpu_s"] + r["broker_cpu_s"]) / m for r in ok], 2),
            "startup_s": spread([r["startup_seconds"] for r in ok], 3),
            "peak_rss_mb": spread([r["peak_rss_mb"] for r in ok], 1),
            "load": spread([r["load"] for r in ok], 2),
            "outside_cpu_share": spread([r["outside_cpu_share"] for r in ok if "outside_cpu_share" in r], 3),
        }
        if name == "mqd":
            out[name]["spawn_to_first_fetch_s"] = spread(
                [r["spawn_to_first_fetch_s"] for r in ok if r.get("spawn_to_first_fetch_s")], 3
            )
            out[name]["burst_share"] = spread(
                [r["burst_share"] for r in ok if r["burst_share"] is not None], 2
            )
            out[name]["median_file_mb"] = spread([r["median_file_mb"] for r in ok if r["median_file_mb"]], 2)
            out[name]["files"] = spread([r["files"] for r in ok])
    mqd_by_round = {r["round"]: r for r in runs if r["name"] == "mqd" and "error" not in r}
    for name in names:
        if name == "mqd":
            continue
        ratios = [
            mqd_by_round[r["round"]]["records_per_s_whole_process"] / r["records_per_s_whole_process"]
            for r in runs
            if r["name"] == name and "error" not in r and r["round"] in mqd_by_round
        ]
        steady = [
            mqd_by_round[r["round"]]["records_per_s"] / r["records_per_s"]
            for r in runs
            if r["name"] == name and "error" not in r and r["round"] in mqd_by_round
        ]
        out[name]["paired_ratio"] = spread(ratios, 2)
        out[name]["paired_ratio_steady"] = spread(steady, 2)
    alts = [n for n in names if n != "mqd" and out[n]["whole"]]
    if alts:
        out["best_alternative"] = max(alts, key=lambda n: out[n]["whole"]["median"])
    if ceiling and out.get("mqd", {}).get("whole"):
        out["mqd_share_of_ceiling"] = round(out["mqd"]["whole"]["median"] / ceiling["records_per_s"], 2)
    return out


def interleave(
    pipelines: list[str], rounds: int, run_one: Callable[[str, int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rounds`` rounds, each running every pipeline once, the order rotated from round to round
    (a load burst from elsewhere hits every pipeline alike); each run logged with the load before it."""
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        k = r % len(pipelines)
        for name in pipelines[k:] + pipelines[:k]:
            before = load()
            res = run_one(name, r)
            res.update(round=r, load=before)
            runs.append(res)
            if "error" in res:
                log(f"  round {r} {name}: {res['error']}")
            else:
                log(
                    f"  round {r} {name}: {res['records_per_s_whole_process']:,} records/s whole "
                    f"process, {res['records_per_s']:,} steady, CPU {res['cpu_s']} s "
                    f"+ brokers {res['broker_cpu_s']} s, exact {res['exact']}"
                    + (f" ({res['inexact']})" if res.get("inexact") else "")
                    + f", load {before}, outside CPU {res.get('outside_cpu_share', 0):.0%}"
                )
    return runs


def prelude(shape: Shape, workdir: Path, args: argparse.Namespace) -> tuple[Workload, dict[str, Any]]:
    """The shape's workload (sized down by --quick) and its result's head, with the sink ceiling."""
    records = max(shape.records // (100 if args.quick else 1), shape.partitions * 10)
    work = Workload(records, shape.size, shape.partitions, 1000, hot=shape.hot)
    result: dict[str, Any] = {
        "shape": shape.name,
        "what": shape.what,
        "records": records,
        "value_size": shape.size,
        "partitions": shape.partitions,
        "hot": shape.hot,
        "rounds": args.rounds,
    }
    log(f"[{shape.name}] {records:,} records of {shape.size} B on {shape.partitions} partitions")
    if "ceiling" in args.pipelines:
        result["sink_ceiling"] = common.sink_ceiling(
            work, workdir / "ceiling", max_records=MAX_RECORDS, max_bytes=MAX_BYTES, compression=COMPRESSION
        )
        shutil.rmtree(workdir / "ceiling", ignore_errors=True)
        log(f"  sink ceiling: {result['sink_ceiling']['records_per_s']:,} records/s")
    return work, result


def run_throughput(shape: Shape, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    work, result = prelude(shape, workdir, args)
    records = work.records
    clients = [c for c in alt_kafka.CLIENTS if c in args.pipelines]
    why_not = alt_kafka.tansu_available() if clients else None
    if why_not:
        result["alternative_skipped"] = why_not
        clients = []
    pipelines = (["mqd"] if "mqd" in args.pipelines else []) + clients
    runs: list[dict[str, Any]] = []
    cluster = LocalCluster(
        workdir / "cluster", topics={TOPIC: shape.partitions}, groups=3, slaves=1, node_settings=NODE_SETTINGS
    )
    tansu = Tansu(workdir / "tansu") if clients else None
    with cluster:
        urls = list(cluster.urls.values())
        if "mqd" in pipelines:
            result["produce_mqd"] = asyncio.run(pl.produce_workload(urls, TOPIC, work, 4))
            asyncio.run(pl.wait_replicated(cluster, TOPIC, shape.partitions))
            log(f"  produced into mqd: {result['produce_mqd']['records_per_s']:,} records/s")
        try:
            if tansu is not None:
                tansu.start()
                tansu.create_topic(TOPIC, shape.partitions)
                result["produce_tansu"] = alt_kafka.produce(tansu.bootstrap, TOPIC, work)
                log(f"  produced into tansu: {result['produce_tansu']['records_per_s']:,} records/s")

            def one(name: str, r: int) -> dict[str, Any]:
                if name == "mqd":
                    return run_mqd(cluster, work, workdir, f"{shape.name}-{r}", timeout=args.timeout)
                assert tansu is not None
                return alt_kafka.consume(
                    name,
                    tansu,
                    TOPIC,
                    work,
                    workdir,
                    max_records=MAX_RECORDS,
                    max_bytes=MAX_BYTES,
                    max_age=MAX_AGE,
                    compression=COMPRESSION,
                    timeout=args.timeout,
                )

            runs = interleave(pipelines, args.rounds, one)
        finally:
            if tansu is not None:
                tansu.stop()
    result["runs"] = runs
    result["summary"] = summarize(runs, records, result.get("sink_ceiling"))
    return result


# ---------------------------------------------------------------------------------------------
# kafka: mqd's Kafka source against the Kafka clients, all on the same Tansu


def run_kafka(shape: Shape, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """mqd (``consumer.source = "kafka"``), confluent-kafka and aiokafka read the same records from
    one Tansu, interleaved; then an idle daemon of the last mqd run's group gives the RSS baseline."""
    work, result = prelude(shape, workdir, args)
    clients = [c for c in alt_kafka.CLIENTS if c in args.pipelines]
    result["broker"] = args.broker
    if args.broker == "kafka":
        result["what"] = result["what"].replace("Tansu", "one Apache Kafka broker")
    why_not = alt_kafka.tansu_available() if args.broker == "tansu" else None
    if why_not:
        result["skipped"] = why_not
        return result
    pipelines = (["mqd"] if "mqd" in args.pipelines else []) + clients
    landing: dict[str, Any] = {
        "max_records": MAX_RECORDS,
        "max_bytes": MAX_BYTES,
        "max_age": MAX_AGE,
        "compression": COMPRESSION,
    }
    tansu = kafka_shape.broker(args.broker, workdir)  # --broker: Tansu or one Apache Kafka broker
    tansu.start()
    try:
        tansu.create_topic(TOPIC, shape.partitions)
        result["produce_tansu"] = alt_kafka.produce(tansu.bootstrap, TOPIC, work)  # the key: either broker
        log(f"  produced into {args.broker}: {result['produce_tansu']['records_per_s']:,} records/s")

        def one(name: str, r: int) -> dict[str, Any]:
            if name == "mqd":
                return kafka_shape.run_mqd(
                    tansu, TOPIC, work, workdir, f"{shape.name}-{r}", timeout=args.timeout,
                    file_sizes=file_sizes, **landing,
                )  # fmt: skip
            return alt_kafka.consume(name, tansu, TOPIC, work, workdir, timeout=args.timeout, **landing)

        runs = interleave(pipelines, args.rounds, one)
        groups = [r["group"] for r in runs if r["name"] == "mqd" and r.get("exact")]
        idle = None
        if groups:
            idle = kafka_shape.idle_rss(
                tansu, TOPIC, workdir, groups[-1], timeout=args.timeout, seconds=2.0 if args.quick else 10.0,
                **landing,
            )  # fmt: skip
            log(f"  idle daemon (nothing to fetch): RSS {idle['rss_mb']} MB")
        if "mqd" in pipelines:
            result["cluster_mode"] = kafka_shape.cluster_join_startup(
                tansu, TOPIC, workdir, timeout=args.timeout, **landing
            )
            log(f"  cluster mode, a fresh group: {result['cluster_mode']}")
    finally:
        tansu.stop()
    result["runs"] = runs
    result["summary"] = summarize(runs, work.records, result.get("sink_ceiling"))
    result["kafka"] = kafka_summary(runs, idle)
    k = result["kafka"]
    log(
        f"  fetch requests {_s(k['fetch_requests'])} per run to {_s(k['leader_nodes_fetched'])} leader "
        f"node(s), {_s(k['partitions_per_request'], '.2f')} partitions per request; RSS above idle "
        f"{_s(k.get('rss_above_idle_mb'), '.1f')} MB, anonymous {_s(k.get('anon_above_idle_mb'), '.1f')} MB "
        f"(budget {k['budget_mb']} MB)"
    )
    return result


def kafka_summary(runs: list[dict[str, Any]], idle: dict[str, Any] | None) -> dict[str, Any]:
    """mqd's fetch and memory figures over its runs (medians [min-max])."""
    ok = [r for r in runs if r["name"] == "mqd" and "error" not in r]
    out: dict[str, Any] = {
        "fetch_requests": spread([sum(r["fetch_requests_per_node"].values()) for r in ok]),
        "leader_nodes_fetched": spread([r["leader_nodes_fetched"] for r in ok]),
        "partitions_per_request": spread(
            [r["partitions_per_request"] for r in ok if r["partitions_per_request"]], 2
        ),
        "budget_mb": round(kafka_shape.MAX_BUFFERED_BYTES / 2**20, 1),
        # the landing holds up to max_bytes besides (publications in flight included)
        "budget_with_landing_mb": round((kafka_shape.MAX_BUFFERED_BYTES + MAX_BYTES) / 2**20, 1),
        "idle": idle,
    }
    if idle:
        above = [r["peak_rss_mb"] - idle["rss_mb"] for r in ok]
        out["rss_above_idle_mb"] = spread(above, 1)
        out["rss_above_idle_within_budget"] = bool(above) and max(above) <= out["budget_mb"]
        out["rss_above_idle_within_budget_with_landing"] = (
            bool(above) and max(above) <= out["budget_with_landing_mb"]
        )
        if idle.get("anon_mb") is not None:
            # the anonymous part alone: the ~20 MB of library code pages (libparquet, the codecs)
            # that only a burst touches are not memory the budget is about
            anon = [r["peak_anon_mb"] - idle["anon_mb"] for r in ok if r.get("peak_anon_mb")]
            out["anon_above_idle_mb"] = spread(anon, 1)
    return out


# ---------------------------------------------------------------------------------------------
# latency


def run_latency_shape(shape: Shape, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    rates = [2_000.0, 10_000.0] if args.quick else [50_000.0, 200_000.0]
    seconds = 2.0 if args.quick else 20.0
    out: dict[str, Any] = {"shape": shape.name, "what": shape.what, "max_age_s": 1.0, "rates": []}
    cluster = LocalCluster(
        workdir / "cluster",
        topics={f"{pl.LATENCY_TOPIC}-{i}": shape.partitions for i in range(len(rates))},
        groups=3,
        slaves=1,
        node_settings=NODE_SETTINGS,
    )
    with cluster:
        for i, rate in enumerate(rates):
            ns = argparse.Namespace(
                landing_max_records=MAX_RECORDS,
                compression=COMPRESSION,
                landing_max_mb=MAX_BYTES // 2**20,
                latency_max_age=1.0,
                partitions=shape.partitions,
                timeout=args.timeout,
                latency_rate=rate,
                latency_seconds=seconds,
                size=shape.size,
            )
            sub = workdir / f"latency-{i}"
            sub.mkdir(parents=True, exist_ok=True)
            before = load()
            res = pl.run_latency(
                cluster, sub, ns, group=f"bench-latency-{i}", topic=f"{pl.LATENCY_TOPIC}-{i}"
            )
            res["load"] = before
            out["rates"].append(res)
            log(
                f"[latency] {rate:,.0f}/s (achieved {res['achieved_rate']:,}): p50 {res['p50_ms']} ms, "
                f"p99 {res['p99_ms']} ms, max {res['max_ms']} ms, daemon CPU {res['daemon_cpu_s']} s, "
                f"load {before}"
            )
            shutil.rmtree(sub, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------
# scale


def run_scale(shape: Shape, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    records = max(shape.records // (100 if args.quick else 1), shape.partitions)
    idle_s = 3.0 if args.quick else 30.0
    work = Workload(records, shape.size, shape.partitions, 1000)
    out: dict[str, Any] = {"shape": shape.name, "what": shape.what, "records": records, "groups": 3}
    cluster = LocalCluster(
        workdir / "cluster", topics={TOPIC: shape.partitions}, groups=3, slaves=1, node_settings=NODE_SETTINGS
    )
    with cluster:
        urls = list(cluster.urls.values())
        asyncio.run(pl.produce_workload(urls, TOPIC, work, 4))
        asyncio.run(pl.wait_replicated(cluster, TOPIC, shape.partitions))
        out["load"] = load()
        out["burst"] = run_mqd(cluster, work, workdir, "scale", timeout=args.timeout, keep=True)
        b = out["burst"]
        log(
            f"[scale] burst over {shape.partitions} partitions: "
            f"{b.get('records_per_s_whole_process', b.get('error'))} records/s whole process, "
            f"exact {b.get('exact')}, load {out['load']}"
        )
        # the same group again, everything committed: a daemon with nothing to do
        cfg = workdir / "mqd-scale.toml"
        client_id = "bench-scale-daemon"
        proc = WatchedProcess(
            pl.daemon_argv(cfg, burst=False), log_path=workdir / "mqd-scale-idle.log", cwd=workdir
        )
        proc.start()
        try:
            wait_until_sync(
                lambda: common.log_event_time(proc.log_path, "first fetch sent") is not None,
                args.timeout,
                "the idle daemon's first fetch",
                interval=0.05,
            )
            first_fetch = common.log_event_time(proc.log_path, "first fetch sent")
            assert first_fetch is not None and proc.pid is not None
            time.sleep(min(5.0, idle_s))  # settle: assignment done, every partition's first answer in
            import psutil

            p = psutil.Process(proc.pid)
            before = pl.fetch_counts(cluster, client_id)
            t0 = p.cpu_times()
            w0 = time.monotonic()
            load0 = load()
            rss: list[float] = []
            while time.monotonic() - w0 < idle_s:
                rss.append(p.memory_info().rss / 2**20)
                time.sleep(0.5)
            t1 = p.cpu_times()
            wall = time.monotonic() - w0
            after = pl.fetch_counts(cluster, client_id)
        finally:
            proc.terminate(timeout=30)
        per_node = {n: after[n] - before.get(n, 0) for n in after}
        rounds = max(per_node.values()) if per_node else 0
        out["idle"] = {
            "seconds": round(wall, 1),
            "spawn_to_first_fetch_s": round(first_fetch - proc.started_at, 3),
            "cpu_share_of_core": round((t1.user + t1.system - t0.user - t0.system) / wall, 4),
            "rss_mb": spread(rss, 1),
            "fetch_requests_per_node": per_node,
            "fetch_rounds": rounds,
            "fetch_requests_per_round": round(sum(per_node.values()) / rounds, 2) if rounds else None,
            "nodes_fetched": sum(1 for v in per_node.values() if v),
            "load": load0,
        }
        i = out["idle"]
        log(
            f"[scale] idle {i['seconds']} s: CPU {i['cpu_share_of_core'] * 100:.2f} % of a core, RSS "
            f"{i['rss_mb']} MB, fetch requests per round {i['fetch_requests_per_round']} "
            f"({per_node}), load {load0}"
        )
    return out


# ---------------------------------------------------------------------------------------------
# start-up: the import floor beside mqd's spawn to first fetch

IMPORTS = {
    "interpreter": "pass",
    "floor: uvloop + aiohttp + pydantic + structlog": "import uvloop, aiohttp, pydantic, structlog",
    "pyarrow + numpy": "import pyarrow, pyarrow.parquet, numpy",
    "mqd run's modules": "import mqd.operator.cli, mqd.process.runner, mqd.process.daemon",
}


def import_times(repeat: int = 5) -> dict[str, float]:
    """Spawn-to-exit seconds of ``python -c "import ..."``, the best of ``repeat`` (the floor any
    daemon on these libraries pays before its first fetch)."""
    import subprocess
    import sys

    out: dict[str, float] = {}
    for name, stmt in IMPORTS.items():
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", stmt], check=True, cwd="/")
            best = min(best, time.perf_counter() - t0)
        out[name] = round(best, 3)
    return out


# ---------------------------------------------------------------------------------------------
# report


def _s(d: dict[str, float] | None, fmt: str = ",.0f") -> str:
    if not d:
        return "-"
    return f"{d['median']:{fmt}} [{d['min']:{fmt}}-{d['max']:{fmt}}]"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"Run {m['time_utc']} on {m['cores']} cores ({m['cpu_model'] or 'unknown CPU'}), "
        f"{m['memory_gib']} GiB, Python {m['python']}; "
        + (
            "mqd cluster of 3 groups x (master + 1 slave), the alternatives on Tansu (memory storage)"
            if any(s.get("shape") != "kafka" for s in result["shapes"])
            else "every pipeline on Tansu (memory storage)"
            if all(s.get("broker", "tansu") == "tansu" for s in result["shapes"])
            else "every pipeline on one Apache Kafka broker"
        )
        + "; landing max_records 500,000, max_bytes 32 MiB, "
        f"max_age 5 s, snappy. {result['rounds']} interleaved rounds; medians [min-max]."
        + (" QUICK run (smoke sizes): not a measurement." if result.get("quick") else ""),
    ]
    shapes = [s for s in result["shapes"] if "summary" in s]
    if shapes:
        lines += [
            "",
            "| shape | records | mqd records/s, whole process | mqd steady | best alternative, whole "
            "process | paired ratio mqd / best | sink ceiling | mqd share of ceiling | mqd CPU s per M "
            "records (daemon / + brokers) | alternative CPU s per M (consumer / + broker) | load | "
            "outside CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in shapes:
            su = s["summary"]
            mq = su.get("mqd") or {}
            best = su.get("best_alternative")
            alt = su.get(best) or {} if best else {}
            ceil = s.get("sink_ceiling") or {}
            lines.append(
                f"| {s['shape']}: {s['what']} | {s['records']:,} | {_s(mq.get('whole'))} | "
                f"{_s(mq.get('steady'))} | {(best + ' ') if best else ''}{_s(alt.get('whole'))} | "
                f"{_s(alt.get('paired_ratio'), '.2f')} | {ceil.get('records_per_s', 0):,} | "
                f"{su.get('mqd_share_of_ceiling', '-')} | {_s(mq.get('cpu_per_m'), '.2f')} / "
                f"{_s(mq.get('cpu_per_m_with_brokers'), '.2f')} | {_s(alt.get('cpu_per_m'), '.2f')} / "
                f"{_s(alt.get('cpu_per_m_with_brokers'), '.2f')} | {_s(mq.get('load'), '.1f')} | "
                f"{_s(mq.get('outside_cpu_share'), '.0%')} |"
            )
        lines += [
            "",
            "| shape | pipeline | whole process records/s | steady records/s | paired ratio mqd / it "
            "(whole; steady) | start-up s | CPU s per M | peak RSS MB | outside CPU | exact |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for s in shapes:
            for name, v in s["summary"].items():
                if not isinstance(v, dict) or "whole" not in v:
                    continue
                ratio = (
                    f"{_s(v.get('paired_ratio'), '.2f')}; {_s(v.get('paired_ratio_steady'), '.2f')}"
                    if name != "mqd"
                    else "-"
                )
                lines.append(
                    f"| {s['shape']} ({s['records']:,}) | {name} | {_s(v['whole'])} | "
                    f"{_s(v['steady'])} | {ratio} | "
                    f"{_s(v['startup_s'], '.2f')} | {_s(v['cpu_per_m'], '.2f')} | "
                    f"{_s(v['peak_rss_mb'], ',.0f')} | {_s(v.get('outside_cpu_share'), '.0%')} | "
                    f"{v['exact']} ({v['runs'] - v['failed']}/{v['runs']}) |"
                )
        lines += ["", "mqd's files and start-up:", ""]
        for s in shapes:
            mq = s["summary"].get("mqd") or {}
            if not mq.get("whole"):
                continue
            lines.append(
                f"- {s['shape']} ({s['records']:,} records): {_s(mq.get('files'))} files, median "
                f"{_s(mq.get('median_file_mb'), '.1f')} MB; share of files >= max_bytes / 2 (each "
                f"partition's last file aside): {_s(mq.get('burst_share'), '.2f')}; spawn to first fetch "
                f"{_s(mq.get('spawn_to_first_fetch_s'), '.2f')} s."
            )
    for s in result["shapes"]:
        k = s.get("kafka")
        if k:
            idle = k.get("idle") or {}
            on = "Apache Kafka" if s.get("broker") == "kafka" else "Tansu"
            lines += [
                "",
                f"kafka (mqd's Kafka source on {on}): {_s(k['fetch_requests'])} fetch requests per run to "
                f"{_s(k['leader_nodes_fetched'])} leader node(s) (one in flight per node: requests per "
                f"round = leader nodes), {_s(k['partitions_per_request'], '.2f')} partitions per request; "
                f"peak RSS above the idle daemon's ({idle.get('rss_mb', '-')} MiB): "
                f"{_s(k.get('rss_above_idle_mb'), '.1f')} MiB (anonymous memory alone, without the "
                f"library code a burst touches: {_s(k.get('anon_above_idle_mb'), '.1f')} MiB) "
                "against a byte budget "
                f"(consumer.max_buffered_bytes) of {k['budget_mb']} MiB, "
                f"{k.get('budget_with_landing_mb', '-')} MiB with landing.max_bytes. mqd runs in "
                "broadcast mode (every partition assigned, offsets in its file), as the clients "
                "assign every partition without a group; in cluster mode a fresh group's spawn to "
                "first fetch is "
                f"{(s.get('cluster_mode') or {}).get('spawn_to_first_fetch_s', '-')} s, of which the "
                f"broker's join wait {(s.get('cluster_mode') or {}).get('group_join_s', '-')} s.",
            ]
        if s.get("shape") == "latency":
            lines += ["", f"Latency (max_age {s['max_age_s']} s), produce to file visible:", ""]
            for r in s["rates"]:
                lines.append(
                    f"- {r['rate']:,.0f} records/s for {r['seconds']} s (achieved {r['achieved_rate']:,}): "
                    f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, max {r['max_ms']} ms over "
                    f"{r['records']:,} records; daemon CPU {r['daemon_cpu_s']} s; load {r['load']}."
                )
        if s.get("shape") == "scale":
            b, i = s["burst"], s["idle"]
            lines += [
                "",
                f"Scale, {s['records']:,} records on 1,000 partitions, 3 groups: burst "
                f"{b.get('records_per_s_whole_process', b.get('error'))} records/s whole process "
                f"(exact {b.get('exact')}, {b.get('files')} files, load {s['load']}); "
                f"idle for {i['seconds']} s: "
                f"daemon {i['cpu_share_of_core'] * 100:.2f} % of a core, RSS {_s(i['rss_mb'], '.0f')} MB, "
                f"{i['fetch_requests_per_round']} fetch requests per round ({i['fetch_rounds']} rounds, "
                f"{i['nodes_fetched']} nodes fetched); spawn to first fetch {i['spawn_to_first_fetch_s']} s "
                f"(load {i['load']}).",
            ]
    imports = result.get("import_times")
    if imports:
        lines += [
            "",
            f"Start-up (best of 5 spawns to exit, load {result.get('import_load')}): "
            + "; ".join(f"{k} {v:.2f} s" for k, v in imports.items())
            + ".",
        ]
    v = m["versions"]
    lines += ["", "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val)]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    import tempfile

    names = args.shape or list(SHAPES)
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    result: dict[str, Any] = {
        "benchmark": "shapes",
        "quick": args.quick,
        "rounds": args.rounds,
        "machine": common.machine_facts(),
        "shapes": [],
    }
    result["import_load"] = load()
    result["import_times"] = import_times(2 if args.quick else 5)
    log(f"start-up: {result['import_times']}")
    base = args.workdir or Path(tempfile.mkdtemp(prefix="mqd-shapes-"))
    stem = "shapes-quick" if args.quick else "shapes"
    try:
        for shape in [sized for name in names for sized in SHAPES[name].sizes()]:
            wd = base / f"{shape.name}-{shape.records}"
            wd.mkdir(parents=True, exist_ok=True)
            try:
                if shape.kind == "throughput":
                    result["shapes"].append(run_throughput(shape, wd, args))
                elif shape.kind == "kafka":
                    result["shapes"].append(run_kafka(shape, wd, args))
                elif shape.kind == "latency":
                    result["shapes"].append(run_latency_shape(shape, wd, args))
                else:
                    result["shapes"].append(run_scale(shape, wd, args))
            finally:
                if args.workdir is None:
                    shutil.rmtree(wd, ignore_errors=True)
            common.write_json(args.out / f"{stem}.json", result)  # each shape's figures as they come
    finally:
        if args.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    table = markdown(result)
    common.write_json(args.out / f"{stem}.json", result)
    (args.out / f"{stem}.md").write_text(table)
    if not args.quick and args.out.resolve() == common.RESULTS.resolve() and set(names) == set(SHAPES):
        pl.update_readme(table)
    log("")
    log(table)
    log(f"wrote {args.out / (stem + '.json')} and {stem}.md")
    bad = [
        s["shape"]
        for s in result["shapes"]
        if any(not v.get("exact", True) for v in (s.get("summary") or {}).values() if isinstance(v, dict))
        or (s.get("burst") and not s["burst"].get("exact"))
    ]
    if bad:
        log(f"NOT EXACT: {bad}")
        return 1
    return 0
