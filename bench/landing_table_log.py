"""``python -m bench.landing_table_log``: the landing table's Delta log at real commit rates, without a
daemon (issue 35, decision 059): its size, a round's cost as the table grows, the memory of a
loaded table.

It drives ``LandingTable`` (mqd/landing/delta_log.py) the way the committer does (read the log up
to its newest version, look up each appId's ``txn``, one commit of the new files), with synthetic
files named like the landing's (nothing is written but the log: an ``add`` is not checked against
the file).

- **sizes** (``--sizes``): a table grown to 10k, 100k, 1M listed files (big commits, then a
  checkpoint). At each size: the checkpoint's bytes (per ``add``) and its CPU and wall; the median
  CPU and wall of ``--rounds`` committer rounds of 1 and of 50 files (the two rates below: a commit
  every 5 s of 12 partitions cutting a file a minute, of 100 partitions cutting one every 10 s),
  with delta-rs's expired-log cleanup after every commit (its default) and only after commits that
  write a checkpoint (mqd's); a fresh process's RSS and CPU to load the table (per listed file),
  with and without ``skip_stats=True``, and to list its files (the cleaner's ``listed()``).
- **runs** (``--run``): a simulated long run per rate: a commit every ``commit_interval`` of
  simulated time, with the files of that interval, at a checkpoint interval and log retention
  given. Simulated time runs faster than the clock, so the log's files are aged by their mtime
  (delta-rs 1.6 expires a log entry by its store's last-modified time: a version below the newest
  checkpoint at or before the oldest version inside the retention, modified at or before now -
  retention; protocol/checkpoints.rs ``cleanup_expired_logs_for``): before every commit that may
  write a checkpoint, every log file's mtime is set to now minus its simulated age. Reported every
  checkpoint: the log's commits and checkpoints kept (count, bytes), the files listed.

The steady state of a longer retention follows from the per-unit figures: commits kept ~ retention
/ commit_interval (+ up to a checkpoint interval), checkpoints kept ~ retention / (checkpoint
interval x commit_interval), rounded up, + 1, each listing every file of the table at its version.

    python -m bench.landing_table_log                                  # sizes 10k,100k,1M + runs
    python -m bench.landing_table_log --sizes 10000,100000 --no-run
    python -m bench.landing_table_log --no-sizes --run-hours 6 --retention 2h --checkpoint-interval 100
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import common
from mqd.landing import layout
from mqd.landing.delta_log import DELTA_LOG, LandingTable
from mqd.landing.layout import FileRange
from mqd.landing.local_objects import LocalObjects

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
TOPIC = "events"
INC = "5e1f0c2a9b7d4e3f8a6c1b0d2e4f6a8c"
T0_MS = 1_796_169_600_000  # 2026-12-02T00:00:00Z: the simulated run's start
FILE_BYTES = 8 * 2**20
RECORDS_PER_FILE = 50_000
GROW_COMMIT = 20_000  # adds per commit while growing a table (the log's size is measured after)


@dataclass(frozen=True, slots=True)
class Rate:
    name: str
    partitions: int
    file_every_s: float  # each partition cuts a file this often (landing.max_age)

    @property
    def files_per_s(self) -> float:
        return self.partitions / self.file_every_s


RATES = (
    Rate("12 partitions, a file a minute", 12, 60.0),
    Rate("100 partitions, a file every 10 s", 100, 10.0),
)


def file_range(partition: int, seq: int, t_ms: int) -> FileRange:
    """The ``seq``-th file of ``partition``, cut at simulated time ``t_ms``."""
    first = seq * RECORDS_PER_FILE
    path = f"{layout.hour_dir(TOPIC, t_ms // 3_600_000)}/{layout.file_name(partition, first, INC)}"
    return FileRange(
        path=path,
        topic=TOPIC,
        partition=partition,
        first_offset=first,
        last_offset=first + RECORDS_PER_FILE - 1,
        count=RECORDS_PER_FILE,
        ts_min=t_ms - 60_000,
        ts_max=t_ms,
        bytes=FILE_BYTES,
        created=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t_ms / 1000)),
        incarnation=INC,
    )


class Files:
    """The files a daemon publishes: round-robin over the partitions, each partition's offsets
    ascending."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.seq = [0] * partitions
        self.next_p = 0
        self.total = 0

    def take(self, n: int, t_ms: int) -> list[FileRange]:
        out = []
        for _ in range(n):
            p = self.next_p
            out.append(file_range(p, self.seq[p], t_ms))
            self.seq[p] += 1
            self.next_p = (p + 1) % self.partitions
        self.total += n
        return out


def committer_round(table: LandingTable, files: list[FileRange]) -> int:
    """What a committer round does with the log: read it to its newest version, look up the
    appIds' ``txn`` versions, commit what is missing."""
    table.load()
    todo = [f for f in files if not table.committed(f)]
    return table.add(todo, committer="bench") if todo else table.version or 0


def log_usage(root: Path) -> dict[str, Any]:
    """Count and bytes of the log's commits and checkpoints."""
    commits = ckpts = commit_bytes = ckpt_bytes = other = 0
    for entry in os.scandir(root / DELTA_LOG):
        size = entry.stat().st_size
        if entry.name.endswith(".json") and entry.name[:20].isdigit():
            commits += 1
            commit_bytes += size
        elif ".checkpoint." in entry.name:
            ckpts += 1
            ckpt_bytes += size
        else:
            other += size
    return {
        "commits": commits,
        "commit_bytes": commit_bytes,
        "checkpoints": ckpts,
        "checkpoint_bytes": ckpt_bytes,
        "log_bytes": commit_bytes + ckpt_bytes + other,
    }


def newest_checkpoint(root: Path) -> Path | None:
    found = sorted((root / DELTA_LOG).glob("*.checkpoint*.parquet"))
    return found[-1] if found else None


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- a fresh process loading the table -----------------------------------------------------------

_LOAD_PROBE = r"""
import gc, json, os, resource, sys, time, warnings
warnings.simplefilter("ignore")
import deltalake, pyarrow
import mqd.landing.delta_log
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
uri, skip = sys.argv[1], sys.argv[2] == "1"
gc.collect()
r0 = rss()
c0, w0 = time.process_time(), time.monotonic()
t = deltalake.DeltaTable(uri, skip_stats=True) if skip else deltalake.DeltaTable(uri)
c1, w1 = time.process_time(), time.monotonic()
gc.collect()
r1 = rss()
t.transaction_version("mqd-landing/events/0/x")
uris = t.file_uris()
c2, w2 = time.process_time(), time.monotonic()
r2 = rss()
print(json.dumps({"rss_before_mb": r0, "rss_loaded_mb": r1, "rss_listed_mb": r2, "files": len(uris),
    "load_cpu_s": c1 - c0, "load_wall_s": w1 - w0, "list_cpu_s": c2 - c1, "list_wall_s": w2 - w1,
    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def load_probe(uri: str, skip_stats: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_PROBE, uri, "1" if skip_stats else "0"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


# -- sizes ---------------------------------------------------------------------------------------


def measure_rounds(
    table: LandingTable, files: Files, per_round: int, rounds: int, t_ms: int
) -> dict[str, Any]:
    cpu, wall = [], []
    for _ in range(rounds):
        batch = files.take(per_round, t_ms)
        c0, w0 = time.process_time(), time.monotonic()
        committer_round(table, batch)
        cpu.append(time.process_time() - c0)
        wall.append(time.monotonic() - w0)
    return {
        "files": per_round,
        "rounds": rounds,
        "cpu_ms": round(statistics.median(cpu) * 1000, 1),
        "cpu_ms_max": round(max(cpu) * 1000, 1),
        "wall_ms": round(statistics.median(wall) * 1000, 1),
        "wall_ms_max": round(max(wall) * 1000, 1),
    }


def drop_commits_below(root: Path, version: int) -> None:
    """Delete the growth's commits under the checkpoint at ``version`` (a bench table: what the
    log retention would expire, at once)."""
    for p in (root / DELTA_LOG).iterdir():
        if p.name.endswith(".json") and p.name[:20].isdigit() and int(p.name[:20]) < version:
            p.unlink()


def entries(
    root: Path, table: LandingTable, files: Files, rounds: int, t_ms: int, pads: list[int]
) -> list[dict[str, Any]]:
    """Rounds of one file against the log folder's entry count (what a retention keeps: every
    read of a local log lists the whole folder), with the cleanup after every commit and only at
    checkpoints; the padding removed after."""
    out = []
    have = 0
    for pad in sorted(pads):
        for i in range(have, pad):
            (root / DELTA_LOG / f"_bench_pad_{i:06d}.txt").write_bytes(b"x" * 1000)
        have = pad
        row: dict[str, Any] = {"log_entries": pad, "listed_files": files.total, "load": common.wait_quiet()}
        for cleanup in ("every_commit", "checkpoint_commits"):
            table.cleanup_every_commit = cleanup == "every_commit"
            row[cleanup] = measure_rounds(table, files, 1, rounds, t_ms)
        table.cleanup_every_commit = False
        row["load_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(row), flush=True)
        out.append(row)
    for p in (root / DELTA_LOG).glob("_bench_pad_*"):
        p.unlink()
    return out


def sizes(
    workdir: Path, targets: list[int], rounds: int, probes: int, pads: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    root = workdir / "sizes"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    table = LandingTable(
        str(root), LocalObjects(root), checkpoint_interval=10**6, log_retention_s=2 * 86400.0
    )
    table.load()
    files = Files(100)
    rows = []
    t_ms = T0_MS
    row0: list[dict[str, Any]] = []
    for target in targets:
        while files.total < target:
            n = min(GROW_COMMIT, target - files.total)
            table.load()
            table.add(files.take(n, t_ms), committer="grow")
            t_ms += 3_600_000
        table.load()
        load = common.wait_quiet()
        c0, w0 = time.process_time(), time.monotonic()
        table.checkpoint()
        ckpt_cpu, ckpt_wall = time.process_time() - c0, time.monotonic() - w0
        ckpt = newest_checkpoint(root)
        assert ckpt is not None
        drop_commits_below(root, table.version or 0)
        ckpt_bytes = ckpt.stat().st_size
        if files.total == targets[0] and pads:
            row0 = entries(root, table, files, rounds, t_ms, pads)
        row: dict[str, Any] = {
            "listed_files": files.total,
            "load": load,
            "checkpoint_bytes": ckpt_bytes,
            "checkpoint_bytes_per_add": round(ckpt_bytes / files.total, 1),
            "checkpoint_cpu_s": round(ckpt_cpu, 3),
            "checkpoint_wall_s": round(ckpt_wall, 3),
            "rounds": {},
        }
        for per_round in (1, 50):
            for cleanup in ("every_commit", "checkpoint_commits"):
                table.cleanup_every_commit = cleanup == "every_commit"
                res = measure_rounds(table, files, per_round, rounds, t_ms)
                row["rounds"][f"{per_round}_{cleanup}"] = res
        table.cleanup_every_commit = False
        table.load()
        table.checkpoint()  # the rounds' commits into a checkpoint too: loads read it
        drop_commits_below(root, table.version or 0)
        row["listed_files"] = files.total
        row["load_probe"] = {}
        for skip in (False, True):
            got = [load_probe(str(root), skip) for _ in range(probes)]
            best = min(got, key=lambda g: g["rss_loaded_mb"])
            row["load_probe"]["skip_stats" if skip else "default"] = {
                "rss_loaded_mb": round(best["rss_loaded_mb"] - best["rss_before_mb"], 1),
                "bytes_per_file": round(
                    (best["rss_loaded_mb"] - best["rss_before_mb"]) * 2**20 / files.total
                ),
                "rss_listed_mb": round(best["rss_listed_mb"] - best["rss_before_mb"], 1),
                "maxrss_mb": round(best["maxrss_mb"], 1),
                "load_cpu_s": round(statistics.median(g["load_cpu_s"] for g in got), 3),
                "load_wall_s": round(statistics.median(g["load_wall_s"] for g in got), 3),
                "list_cpu_s": round(statistics.median(g["list_cpu_s"] for g in got), 3),
                "runs": len(got),
            }
        row["load_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    shutil.rmtree(root, ignore_errors=True)
    return rows, row0


# -- simulated runs ------------------------------------------------------------------------------


def age_log(root: Path, written: dict[str, float], sim_now: float) -> None:
    """Set each log file's mtime to now minus its simulated age."""
    now = time.time()
    for entry in os.scandir(root / DELTA_LOG):
        t = written.get(entry.name)
        if t is None:
            continue
        age = sim_now - t
        os.utime(entry.path, (now - age, now - age))


def note_new(root: Path, written: dict[str, float], sim_now: float) -> None:
    for entry in os.scandir(root / DELTA_LOG):
        if entry.name not in written and entry.name != "_last_checkpoint":
            written[entry.name] = sim_now


def run(
    workdir: Path,
    rate: Rate,
    hours: float,
    commit_interval: float,
    checkpoint_interval: int,
    retention_s: float,
) -> dict[str, Any]:
    root = workdir / f"run-{rate.partitions}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    table = LandingTable(
        str(root), LocalObjects(root), checkpoint_interval=checkpoint_interval, log_retention_s=retention_s
    )
    table.load()
    files = Files(rate.partitions)
    written: dict[str, float] = {}
    note_new(root, written, 0.0)
    owed = 0.0
    commits = int(hours * 3600 / commit_interval)
    samples = []
    cpu_total = 0.0
    wall0 = time.monotonic()
    load = common.wait_quiet()
    for i in range(1, commits + 1):
        sim_now = i * commit_interval
        owed += rate.files_per_s * commit_interval
        n = int(owed)
        owed -= n
        if n == 0:
            continue
        version = table.version or 0
        if (version + 2) % checkpoint_interval == 0:  # the next commit may write a checkpoint
            age_log(root, written, sim_now)
        c0 = time.process_time()
        committer_round(table, files.take(n, T0_MS + int(sim_now * 1000)))
        cpu_total += time.process_time() - c0
        note_new(root, written, sim_now)
        if (table.version or 0) % checkpoint_interval == 0 or i == commits:
            use = log_usage(root)
            use.update(sim_hours=round(sim_now / 3600, 2), version=table.version, listed=files.total)
            samples.append(use)
    end = log_usage(root)
    ckpt = newest_checkpoint(root)
    out = {
        "rate": rate.name,
        "partitions": rate.partitions,
        "file_every_s": rate.file_every_s,
        "files_per_s": rate.files_per_s,
        "sim_hours": hours,
        "commit_interval_s": commit_interval,
        "checkpoint_interval": checkpoint_interval,
        "log_retention_s": retention_s,
        "commits": commits,
        "listed_files": files.total,
        "end": end,
        "commit_bytes_mean": round(end["commit_bytes"] / max(1, end["commits"])),
        "newest_checkpoint_bytes": ckpt.stat().st_size if ckpt else None,
        "checkpoint_bytes_per_add": round(ckpt.stat().st_size / files.total, 1) if ckpt else None,
        "cpu_s_per_commit_ms": round(cpu_total / commits * 1000, 2),
        "wall_s": round(time.monotonic() - wall0, 1),
        "load": load,
        "load_after": round(os.getloadavg()[0], 2),
        "samples": samples,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def projection(
    rate: Rate,
    commit_bytes: float,
    bytes_per_add: float,
    retention_s: float,
    ci: int,
    interval: float,
    days: float,
) -> dict[str, Any]:
    """The log's steady size after ``days`` of the rate (no cleaner: the table lists every file
    landed), from the measured per-unit figures: commits within the retention (plus up to one
    checkpoint interval) and the checkpoints within it (plus the safe one), each listing the files
    of its time."""
    n_commits = retention_s / interval + ci
    n_ckpt = math.ceil(retention_s / (ci * interval)) + 1  # the retention's, and the safe one before
    listed_now = rate.files_per_s * days * 86400
    per_ckpt_files = [max(0.0, listed_now - k * ci * interval * rate.files_per_s) for k in range(n_ckpt)]
    ckpt_bytes = sum(per_ckpt_files) * bytes_per_add
    return {
        "rate": rate.name,
        "days": days,
        "checkpoint_interval": ci,
        "log_retention_h": round(retention_s / 3600, 1),
        "commits_kept": round(n_commits),
        "checkpoints_kept": n_ckpt,
        "listed_files": round(listed_now),
        "commit_mb": round(n_commits * commit_bytes / 1e6, 1),
        "checkpoint_mb": round(ckpt_bytes / 1e6, 1),
        "log_mb": round((n_commits * commit_bytes + ckpt_bytes) / 1e6, 1),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = []
    if report.get("sizes"):
        lines += [
            "| listed files | checkpoint bytes (per add) | checkpoint CPU s / wall s "
            "| round of 1 file: CPU ms / wall ms (cleanup every commit → at checkpoints) "
            "| round of 50 files | fresh load: RSS MB (bytes per file), default / skip_stats "
            "| load CPU s | + file list (cleaner) MB | load |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["sizes"]:
            rd = r["rounds"]

            def rr(k: str, rd: dict[str, Any] = rd) -> str:
                a, b = rd[f"{k}_every_commit"], rd[f"{k}_checkpoint_commits"]
                return f"{a['cpu_ms']} / {a['wall_ms']} → {b['cpu_ms']} / {b['wall_ms']}"

            d, s = r["load_probe"]["default"], r["load_probe"]["skip_stats"]
            lines.append(
                f"| {r['listed_files']:,} "
                f"| {r['checkpoint_bytes'] / 1e6:.1f} MB ({r['checkpoint_bytes_per_add']}) "
                f"| {r['checkpoint_cpu_s']} / {r['checkpoint_wall_s']} | {rr('1')} | {rr('50')} "
                f"| {d['rss_loaded_mb']} ({d['bytes_per_file']}) "
                f"/ {s['rss_loaded_mb']} ({s['bytes_per_file']}) "
                f"| {d['load_cpu_s']} | +{round(d['rss_listed_mb'] - d['rss_loaded_mb'], 1)} "
                f"| {r['load']}-{r['load_after']} |"
            )
    if report.get("entries"):
        lines += [
            "",
            "| log folder entries | listed files | round of 1 file, cleanup every commit: CPU ms / wall ms "
            "| cleanup at checkpoints only | load |",
            "|---|---|---|---|---|",
        ]
        for r in report["entries"]:
            a, b = r["every_commit"], r["checkpoint_commits"]
            lines.append(
                f"| {r['log_entries']:,} | {r['listed_files']:,} | {a['cpu_ms']} / {a['wall_ms']} "
                f"| {b['cpu_ms']} / {b['wall_ms']} | {r['load']}-{r['load_after']} |"
            )
    if report.get("runs"):
        lines += [
            "",
            "| simulated run | hours | checkpoint interval | retention | commits kept (MB) "
            "| checkpoints kept (MB) | log MB | listed files | bytes per commit | CPU ms per commit | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["runs"]:
            e = r["end"]
            lines.append(
                f"| {r['rate']} | {r['sim_hours']} | {r['checkpoint_interval']} "
                f"| {r['log_retention_s'] / 3600:g} h "
                f"| {e['commits']} ({e['commit_bytes'] / 1e6:.1f}) "
                f"| {e['checkpoints']} ({e['checkpoint_bytes'] / 1e6:.1f}) "
                f"| {e['log_bytes'] / 1e6:.1f} | {r['listed_files']:,} | {r['commit_bytes_mean']:,} "
                f"| {r['cpu_s_per_commit_ms']} | {r['load']}-{r['load_after']} |"
            )
    if report.get("projections"):
        lines += [
            "",
            "| projected steady log (no cleaner) | after days | checkpoint interval | retention "
            "| commits kept | checkpoints kept | listed files | log MB (commits + checkpoints) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in report["projections"]:
            lines.append(
                f"| {p['rate']} | {p['days']} | {p['checkpoint_interval']} | {p['log_retention_h']} h "
                f"| {p['commits_kept']:,} | {p['checkpoints_kept']} | {p['listed_files']:,} "
                f"| {p['log_mb']:,} ({p['commit_mb']:,} + {p['checkpoint_mb']:,}) |"
            )
    return "\n".join(lines)


def duration(s: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(s[:-1]) * units[s[-1]] if s[-1] in units else float(s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes", default="10000,100000,1000000", help="listed files to measure at, comma-separated"
    )
    ap.add_argument("--no-sizes", action="store_true")
    ap.add_argument("--rounds", type=int, default=15, help="committer rounds measured per size and kind")
    ap.add_argument(
        "--log-entries",
        default="0,720,4320,17280,34560",
        help="log folder entries to measure rounds against (1 h, 6 h, 1 d, 2 d of commits every 5 s)",
    )
    ap.add_argument(
        "--probes", type=int, default=2, help="fresh processes loading the table per size and kind"
    )
    ap.add_argument("--no-run", action="store_true")
    ap.add_argument("--run-hours", type=float, default=2.5, help="simulated hours of each run")
    ap.add_argument("--retention", default="1h", help="log retention of the simulated runs (s/m/h/d)")
    ap.add_argument("--checkpoint-interval", type=int, default=100)
    ap.add_argument("--commit-interval", type=float, default=5.0)
    ap.add_argument("--project", default="100,1000", help="checkpoint intervals of the projections")
    ap.add_argument("--project-retention", default="2d,1h", help="log retentions of the projections")
    ap.add_argument("--project-days", default="1,7", help="days of landing of the projections")
    common.add_quiet_args(ap)
    ap.add_argument("--out", type=Path, default=RESULTS / "landing_table_log.json")
    args = ap.parse_args(argv)
    common.apply_quiet_args(args)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count()},
        "args": vars(args) | {"out": str(args.out)},
    }
    with tempfile.TemporaryDirectory(prefix="mqd-ltl-") as tmp:
        workdir = Path(tmp)
        if not args.no_sizes:
            report["sizes"], report["entries"] = sizes(
                workdir,
                [int(s) for s in args.sizes.split(",") if s],
                args.rounds,
                args.probes,
                [int(s) for s in args.log_entries.split(",") if s],
            )
        if not args.no_run:
            report["runs"] = []
            for rate in RATES:
                res = run(
                    workdir,
                    rate,
                    args.run_hours,
                    args.commit_interval,
                    args.checkpoint_interval,
                    duration(args.retention),
                )
                print(json.dumps({k: v for k, v in res.items() if k != "samples"}), flush=True)
                report["runs"].append(res)
    by_add = [r["checkpoint_bytes_per_add"] for r in report.get("sizes", [])]
    by_add += [r["checkpoint_bytes_per_add"] for r in report.get("runs", []) if r["checkpoint_bytes_per_add"]]
    if by_add and report.get("runs"):
        bpa = statistics.median(by_add)
        report["projections"] = [
            projection(
                rate, r["commit_bytes_mean"], bpa, duration(ret), ci, args.commit_interval, float(days)
            )
            for rate, r in zip(RATES, report["runs"], strict=True)
            for days in args.project_days.split(",")
            for ret in args.project_retention.split(",")
            for ci in (int(c) for c in args.project.split(","))
        ]
    report["maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    print("\n" + markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
