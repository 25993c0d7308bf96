"""``python -m bench.object_store_bench``: the landing's stores compared, local directory vs SeaweedFS.

Two parts (issue 15), each run ``--runs`` times with the two stores interleaved (the order flips
every run, so a load that drifts over time hits both alike); every figure is the median of the
runs with [min-max] beside it, and the 1-minute load average of the machine during those runs.

1. **publish**: ``Publisher.publish`` (stage + claim + promote, landing format 3) of one file at a
   time, sizes 64 KiB, 1 MiB and 8 MiB of incompressible values (1 KiB each), on a fresh landing
   per run: the local store (a directory on this machine's disk) and the object store over
   SeaweedFS (``weed mini`` on 127.0.0.1, mqd.testing.seaweedfs). Reported: latency p50 and p99 of
   one publication, files/s and MB/s of the sequence.
2. **e2e**: the main shape of ``make bench`` (by default 2,000,000 records of 100 B on 12
   partitions, 3 broker groups of a master and a slave) produced once; then ``mqd run --burst``
   lands the whole backlog into a fresh local landing or a fresh ``s3://`` prefix under a fresh
   consumer group, with the daemon's default landing settings. Reported: records/s and MB/s from
   "daemon started" to the exit (as pipeline.py's mqd row) and records/s over the whole process
   (interpreter start-up and imports included); checked: the store's manifest holds N.

Results: ``results/object_store.json`` and ``results/object_store.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench import common
from bench.alt_consumer import empty_headers
from bench.common import MB, RESULTS, WatchedProcess, Workload, machine_facts, write_json
from bench.pipeline import TOPIC, daemon_argv, produce_workload, wait_replicated
from mqd.landing.backends import open_store
from mqd.landing.publisher import Publisher
from mqd.landing.store import LandingStore
from mqd.records import RECORD_SCHEMA
from mqd.testing import LocalCluster, daemon_section, to_toml
from mqd.testing.seaweedfs import REGION, SeaweedFS

KiB = 1024
FILE_SIZES = (64 * KiB, 1024 * KiB, 8 * 1024 * KiB)
VALUE_SIZE = 1024
STORES = ("local", "seaweedfs")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def spread(values: list[float], digits: int = 1) -> str:
    """``median [min-max]``, the way every figure of this benchmark is shown."""
    med = statistics.median(values)
    return f"{med:,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def records(first: int, n: int, rng: np.random.Generator) -> pa.Table:
    """``n`` RECORD_SCHEMA rows from offset ``first``, random 1 KiB values, timestamps now."""
    values = rng.integers(0, 256, size=n * VALUE_SIZE, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * VALUE_SIZE)
    now = int(time.time() * 1000)
    return pa.Table.from_arrays(
        [
            pa.array(np.arange(first, first + n, dtype=np.int64)),
            pa.array(np.full(n, now, dtype=np.int64)).cast(pa.timestamp("ms", tz="UTC")),
            pa.nulls(n, pa.binary()),
            pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(values)]),
            empty_headers(n),
        ],
        schema=RECORD_SCHEMA,
    )


# ---------------------------------------------------------------------------------------------
# part 1: one publication at a time


def publish_sizes(store: LandingStore, files: dict[int, int]) -> dict[int, dict[str, Any]]:
    """Publish ``files[size]`` files of each size, one after the other, each size on its own
    partition chain; per size the latencies (ms), the seconds of the sequence and the bytes."""
    publisher = Publisher(store, compression="none")  # the values are random: nothing to gain
    incarnation = uuid.uuid4().hex
    rng = np.random.default_rng(7)
    out: dict[int, dict[str, Any]] = {}
    for partition, size in enumerate(FILE_SIZES):
        n = size // VALUE_SIZE
        tables = [records(i * n, n, rng) for i in range(files[size])]  # built before the clock runs
        latencies: list[float] = []
        nbytes = 0
        last: int | None = None
        t0 = time.perf_counter()
        for table in tables:
            s = time.perf_counter()
            got = publisher.publish(
                "bench", partition, table, last, incarnation=incarnation, expected_incarnation=incarnation
            )
            latencies.append((time.perf_counter() - s) * 1000)
            last = got.last_offset
            nbytes += got.bytes or size
        out[size] = {"latencies_ms": latencies, "seconds": time.perf_counter() - t0, "bytes": nbytes}
    return out


def publish_part(server: SeaweedFS, workdir: Path, runs: int, files: dict[int, int]) -> dict[str, Any]:
    samples: dict[str, dict[int, list[dict[str, float]]]] = {s: {z: [] for z in FILE_SIZES} for s in STORES}
    loads: dict[str, list[float]] = {s: [] for s in STORES}
    for run in range(runs):
        order = STORES if run % 2 == 0 else tuple(reversed(STORES))
        for name in order:
            if name == "local":
                store: LandingStore = open_store(workdir / f"publish-{run}")
            else:
                store = open_store(
                    f"s3://{server.bucket}/publish-{run}-{secrets.token_hex(4)}",
                    endpoint_url=server.endpoint,
                    region=REGION,
                )
            store.open()
            loads[name].append(load1())
            got = publish_sizes(store, files)
            loads[name].append(load1())
            for size, r in got.items():
                lat = np.array(r["latencies_ms"])
                samples[name][size].append(
                    {
                        "p50_ms": float(np.percentile(lat, 50)),
                        "p99_ms": float(np.percentile(lat, 99)),
                        "files_per_s": len(lat) / r["seconds"],
                        "mb_per_s": r["bytes"] / MB / r["seconds"],
                    }
                )
            log(f"publish run {run + 1}/{runs} {name}: done (load {loads[name][-1]})")
        shutil.rmtree(workdir / f"publish-{run}", ignore_errors=True)
    rows = []
    for name in STORES:
        for size in FILE_SIZES:
            runs_of = samples[name][size]
            rows.append(
                {
                    "store": name,
                    "file_kib": size // KiB,
                    "files_per_run": files[size],
                    **{
                        k: spread([r[k] for r in runs_of])
                        for k in ("p50_ms", "p99_ms", "files_per_s", "mb_per_s")
                    },
                    "load1": f"{min(loads[name])}-{max(loads[name])}",
                    "runs": runs_of,
                }
            )
    return {"runs": runs, "rows": rows}


# ---------------------------------------------------------------------------------------------
# part 2: the daemon end to end


def daemon_toml(path: Path, urls: list[str], group: str, landing: str, endpoint: str | None) -> Path:
    """A burst daemon with the default landing settings; ``endpoint`` for an s3:// landing."""
    body: dict[str, Any] = {
        "consumer": {
            "group": group,
            "client_id": f"{group}-daemon",
            "bootstrap": urls,
            "topics": [TOPIC],
            "consume_from": "first",
        },
        "landing": {"dir": landing},
        "landing.s3": {"endpoint_url": endpoint, "region": REGION} if endpoint else None,
        "admin": {"enabled": False},
        "log": {"level": "info", "format": "json"},  # "daemon started" marks the end of start-up
        "daemon": daemon_section(path.parent / f"state-{group}"),
    }
    path.write_text(to_toml(body))
    return path


def run_daemon(
    urls: list[str], workdir: Path, name: str, landing: str, server: SeaweedFS, work: Workload, timeout: float
) -> dict[str, Any]:
    endpoint = server.endpoint if landing.startswith("s3://") else None
    cfg = daemon_toml(workdir / f"{name}.toml", urls, name, landing, endpoint)
    env = server.env() if endpoint else {}
    proc = WatchedProcess(
        daemon_argv(cfg, burst=True), log_path=workdir / f"{name}.log", cwd=workdir, env=env
    )
    load_before = load1()
    proc.start()
    stats = proc.finish(timeout)
    if stats.exit_code != 0:
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name}: mqd daemon exited with {stats.exit_code}:\n{tail}")
    store = open_store(landing, endpoint_url=endpoint, region=REGION if endpoint else None)
    manifest = store.manifest(TOPIC)
    landed = sum(r.count for r in manifest)
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    seconds = max(stats.ended_at - started, 1e-3)
    return {
        "records": landed,
        "complete": landed == work.records,
        "files": len(manifest),
        "seconds": round(seconds, 3),
        "process_seconds": round(stats.wall_s, 3),
        "records_per_s": landed / seconds,
        "records_per_s_whole_process": landed / stats.wall_s,
        "mb_per_s": landed * work.size / MB / seconds,
        "cpu_s": round(stats.cpu_s, 2),
        "load1": [load_before, load1()],
    }


def e2e_part(server: SeaweedFS, workdir: Path, runs: int, work: Workload, timeout: float) -> dict[str, Any]:
    cluster = LocalCluster(
        workdir / "cluster",
        topics={TOPIC: work.partitions},
        groups=3,
        slaves=1,
        node_settings={"log_level": "warning", "liveness_interval_ms": 500, "liveness_timeout_ms": 3000},
    )
    samples: dict[str, list[dict[str, Any]]] = {s: [] for s in STORES}
    with cluster:
        urls = list(cluster.urls.values())
        produced = asyncio.run(produce_workload(urls, TOPIC, work, 4))
        log(f"e2e: produced {work.records:,} records ({produced['records_per_s']:,} records/s)")
        asyncio.run(wait_replicated(cluster, TOPIC, work.partitions))
        for run in range(runs):
            order = STORES if run % 2 == 0 else tuple(reversed(STORES))
            for name in order:
                landing = (
                    str(workdir / f"landing-{run}")
                    if name == "local"
                    else f"s3://{server.bucket}/e2e-{run}-{secrets.token_hex(4)}"
                )
                r = run_daemon(urls, workdir, f"{name}-{run}", landing, server, work, timeout)
                samples[name].append(r)
                log(
                    f"e2e run {run + 1}/{runs} {name}: {r['records_per_s']:,.0f} records/s, load {r['load1']}"
                )
                if name == "local":
                    shutil.rmtree(workdir / f"landing-{run}", ignore_errors=True)
    rows = []
    for name in STORES:
        got = samples[name]
        loads = [x for r in got for x in r["load1"]]
        rows.append(
            {
                "store": name,
                "complete": all(r["complete"] for r in got),
                "files": [r["files"] for r in got],
                "records_per_s": spread([r["records_per_s"] for r in got], 0),
                "records_per_s_whole_process": spread([r["records_per_s_whole_process"] for r in got], 0),
                "mb_per_s": spread([r["mb_per_s"] for r in got]),
                "load1": f"{min(loads)}-{max(loads)}",
                "runs": got,
            }
        )
    return {
        "records": work.records,
        "value_size": work.size,
        "partitions": work.partitions,
        "runs": runs,
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    lines = []
    pub = result.get("publish")
    if pub:
        lines += [
            f"Publish, one file at a time (median [min-max] of {pub['runs']} interleaved runs; load = "
            "1-minute load average during the runs):",
            "",
            "| store | file | files/run | p50 ms | p99 ms | files/s | MB/s | load |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in pub["rows"]:
            lines.append(
                f"| {r['store']} | {r['file_kib']} KiB | {r['files_per_run']} | {r['p50_ms']} "
                f"| {r['p99_ms']} | {r['files_per_s']} | {r['mb_per_s']} | {r['load1']} |"
            )
        lines.append("")
    e2e = result.get("e2e")
    if e2e:
        lines += [
            f"End to end, `mqd run --burst` of {e2e['records']:,} records of {e2e['value_size']} B on "
            f"{e2e['partitions']} partitions (median [min-max] of {e2e['runs']} interleaved runs):",
            "",
            "| landing | records/s | MB/s | records/s, whole process | files per run | complete | load |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in e2e["rows"]:
            lines.append(
                f"| {r['store']} | {r['records_per_s']} | {r['mb_per_s']} "
                f"| {r['records_per_s_whole_process']} | {r['files']} | {r['complete']} | {r['load1']} |"
            )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.object_store_bench", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per store (>= 1)")
    ap.add_argument("--records", type=int, default=2_000_000, help="e2e: records produced")
    ap.add_argument("--size", type=int, default=100, help="e2e: value size in bytes")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument(
        "--files", type=str, default="64:40,1024:20,8192:6", help="publish: files per size (KiB:n)"
    )
    ap.add_argument("--skip", action="append", default=[], choices=["publish", "e2e"])
    ap.add_argument("--timeout", type=float, default=900.0, help="bound of one daemon run")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--workdir", type=Path, default=None, help="keep data and logs here (default: temp)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    return args


def main(argv: list[str] | None = None, *, emit: Callable[[str], None] = log) -> int:
    args = parse_args(argv)
    files = {int(k) * KiB: int(v) for k, v in (item.split(":") for item in args.files.split(","))}
    if set(files) != set(FILE_SIZES):
        raise SystemExit(f"--files names every size of {[s // KiB for s in FILE_SIZES]} KiB")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mqd-osbench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"benchmark": "object_store", "machine": machine_facts()}
    server = SeaweedFS(workdir / "seaweedfs", bucket="bench")
    try:
        server.start()
        os.environ.update(server.env())  # boto3's standard chain, as a deployment's daemon reads it
        if "publish" not in args.skip:
            result["publish"] = publish_part(server, workdir, args.runs, files)
        if "e2e" not in args.skip:
            work = Workload(args.records, args.size, args.partitions, 1000)
            result["e2e"] = e2e_part(server, workdir, args.runs, work, args.timeout)
    finally:
        server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    table = markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "object_store.json", result)
    (args.out / "object_store.md").write_text(table)
    emit(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
