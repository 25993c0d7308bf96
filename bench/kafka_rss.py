"""Interleaved A/B runs of mqd's Kafka source on the ``kafka`` shape's backlog: peak RSS above an idle
daemon, per variant (issue 14's memory figure, without the Kafka clients' runs).

One Tansu and one backlog (6 M x 100 B on 12 partitions by default, produced once), then rounds of
``mqd run --burst`` (broadcast mode, a fresh state folder and landing each run), round-robin over
the variants, each run under bench/rss_probe.py (its samples: RSS, glibc's heap, Arrow's pool).
After the rounds, one idle daemon per variant (nothing to fetch) gives that variant's baseline.

    python -m bench.kafka_rss --rounds 3 --variant base= \\
        --variant arena2=env.MALLOC_ARENA_MAX=2 --variant w1=env.RSSPROBE_WORKERS=1

A variant is ``name=section.key=value,...``: section ``env`` sets the daemon's environment, other
sections override its config (as bench/memab.py). A variant may also name a code tree:
``name=@/path/to/tree:items``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import alt_kafka, common, kafka_shape, shapes
from bench.common import WatchedProcess, Workload, check_exact
from bench.pipeline import landed_files
from mqd.testing.tansu import Tansu

TOPIC = shapes.TOPIC
LANDING: dict[str, Any] = {
    "max_records": shapes.MAX_RECORDS,
    "max_bytes": shapes.MAX_BYTES,
    "max_age": shapes.MAX_AGE,
    "compression": shapes.COMPRESSION,
}


def parse_variant(spec: str) -> tuple[str, Path | None, dict[str, dict[str, Any]]]:
    name, _, rest = spec.partition("=")
    tree: Path | None = None
    if rest.startswith("@"):
        path, _, rest = rest[1:].partition(":")
        tree = Path(path).resolve()
    return name, tree, common.parse_overrides(rest)


def config_for(
    tansu: Tansu, workdir: Path, group: str, over: dict[str, dict[str, Any]], *, idle: bool = False
) -> Path:
    landing = workdir / ("landing-idle" if idle else f"landing-{group}")
    cfg = kafka_shape.daemon_config(
        workdir / f"{group}{'-idle' if idle else ''}.toml",
        tansu.bootstrap,
        topic=TOPIC,
        group=group,
        landing=landing,
        **LANDING,
    )
    common.apply_overrides(cfg, over)
    return cfg


def env_for(tree: Path | None, over: dict[str, dict[str, Any]], probe: Path) -> dict[str, str]:
    env = {k: str(v) for k, v in over.get("env", {}).items()}
    env["RSSPROBE_OUT"] = str(probe)
    root = Path(__file__).resolve().parent.parent  # bench.rss_probe from this checkout
    env["PYTHONPATH"] = str(root) if tree is None else f"{tree}:{root}"
    return env


def argv(cfg: Path, *, burst: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.rss_probe",
        "run",
        "--config",
        str(cfg),
        *(["--burst"] if burst else []),
    ]


def probe_summary(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text().splitlines()
        last = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}
    return last if "at_peak" in last else {}


def run_once(
    tansu: Tansu, work: Workload, workdir: Path, name: str, tree: Path | None, over: dict[str, Any], n: int
) -> dict[str, Any]:
    group = f"rss-{name}-{n}-{int(time.time() * 1000) % 10**8}"
    cfg = config_for(tansu, workdir, group, over)
    probe = workdir / f"probe-{group}.jsonl"
    proc = WatchedProcess(
        argv(cfg, burst=True), log_path=workdir / f"{group}.log", cwd=workdir, env=env_for(tree, over, probe)
    )
    proc.start()
    stats = proc.finish(900)
    out: dict[str, Any] = {"name": name, "group": group, "exit": stats.exit_code}
    landing = workdir / f"landing-{group}"
    if stats.exit_code == 0:
        out["inexact"] = check_exact(landed_files(landing, TOPIC), work.per_partition())
    shutil.rmtree(landing, ignore_errors=True)
    started = common.log_event_time(proc.log_path, "daemon started") or stats.started_at
    out.update(
        peak_rss_mb=round(stats.peak_rss_mb, 1),
        seconds=round(stats.ended_at - started, 2),
        cpu_s=round(stats.cpu_s, 2),
        probe=probe_summary(probe),
    )
    return out


def idle_rss(
    tansu: Tansu, workdir: Path, name: str, tree: Path | None, over: dict[str, Any], group: str
) -> dict[str, float]:
    """Max RSS over 5 s of a daemon on ``group``'s state (nothing to fetch), and the probe's maxima
    (anonymous and file-backed RSS apart)."""
    import psutil

    from mqd.waiting import wait_until_sync

    cfg = config_for(tansu, workdir, group, over, idle=True)
    probe = workdir / f"probe-idle-{name}.jsonl"
    proc = WatchedProcess(
        argv(cfg, burst=False),
        log_path=workdir / f"idle-{name}.log",
        cwd=workdir,
        env=env_for(tree, over, probe),
    )
    proc.start()
    try:
        wait_until_sync(
            lambda: common.log_event_time(proc.log_path, "first fetch sent") is not None,
            120,
            "idle first fetch",
        )
        assert proc.pid is not None
        p = psutil.Process(proc.pid)
        rss = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5.0:
            rss.append(p.memory_info().rss / 2**20)
            time.sleep(0.25)
    finally:
        proc.terminate(timeout=30)
    return {"rss": round(max(rss), 1), **probe_summary(probe).get("max", {})}


def spread(xs: list[float]) -> list[float] | None:
    """median, min, max"""
    return [round(statistics.median(xs), 1), round(min(xs), 1), round(max(xs), 1)] if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=6_000_000)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", default=[], help="name=section.key=value,...")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant] or [("base", None, {})]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mqd-kafka-rss-"))
    workdir.mkdir(parents=True, exist_ok=True)
    work = Workload(args.records, 100, args.partitions, 1000)
    runs: list[dict[str, Any]] = []
    idle: dict[str, dict[str, float]] = {}
    tansu = Tansu(workdir / "tansu")
    tansu.start()
    try:
        tansu.create_topic(TOPIC, args.partitions)
        produced = alt_kafka.produce(tansu.bootstrap, TOPIC, work)
        print(f"produced {produced}", flush=True)
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for name, tree, over in order:
                res = run_once(tansu, work, workdir, name, tree, over, r)
                runs.append(res)
                p = res["probe"].get("at_peak", {})
                print(
                    f"round {r} {name}: peak {res['peak_rss_mb']} MiB, {res['seconds']} s, "
                    f"cpu {res['cpu_s']} s, "
                    f"exit {res['exit']}, inexact {res.get('inexact')}; at peak {p}",
                    flush=True,
                )
        for name, tree, over in variants:
            group = next(r["group"] for r in runs if r["name"] == name and r["exit"] == 0)
            idle[name] = idle_rss(tansu, workdir, name, tree, over, group)
            print(f"idle {name}: {idle[name]} MiB", flush=True)
    finally:
        tansu.stop()
    summary = {}
    for name, _, _ in variants:
        ok = [r for r in runs if r["name"] == name and r["exit"] == 0]
        above = [r["peak_rss_mb"] - idle[name]["rss"] for r in ok]
        # at the RSS peak: anonymous memory above the idle daemon's, and file-backed pages (code of
        # libraries only the burst touches: libparquet, the codecs) apart
        anon = [r["probe"]["at_peak"]["RssAnon"] - idle[name].get("RssAnon", 0) for r in ok if r["probe"]]
        file = [r["probe"]["at_peak"]["RssFile"] - idle[name].get("RssFile", 0) for r in ok if r["probe"]]
        secs = [r["seconds"] for r in runs if r["name"] == name and r["exit"] == 0]
        cpu = [r["cpu_s"] for r in runs if r["name"] == name and r["exit"] == 0]
        summary[name] = {
            "idle_mb": idle[name]["rss"],
            "above_idle_mb": spread(above),
            "anon_above_idle_mb": spread(anon),
            "file_above_idle_mb": spread(file),
            "seconds": [statistics.median(secs), min(secs), max(secs)],
            "cpu_s": [statistics.median(cpu), min(cpu), max(cpu)],
        }
        print(f"{name}: {summary[name]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "idle": idle, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
