"""``python -m bench.spark_once``: how long ``mqd spark --once`` takes on an up-to-date Delta table.

Issue 29's last "done when": ``mqd spark --once`` on an up-to-date table finishes in <= 15 s wall on
this 2-core machine. What runs:

1. **Landings**: per table size, ``--partitions`` (12) partitions of topic ``events`` get ``F`` files
   of ``--records`` (100) records each, published with mqd's own ``Publisher`` into a local
   ``LocalStore`` (as tests/support/delta.py's ``land()``); one file per partition per hour, so the
   table's ``dt`` partitions span days. Sizes: ``--sizes 10,100`` (F).
2. **Pipelines**, each with its own table and checkpoint on the same landing:
   - ``mqd`` (and any ``--variant name=tree``: another checkout of mqd, run with ``PYTHONPATH``):
     the real CLI, ``python -m mqd.operator.cli spark --once -c <config>``, config defaults except
     ``max_files_per_trigger = partitions`` (one file per partition per batch, so a table of F
     files per partition has F versions in its Delta log: few against many);
   - ``bare``: the alternative at its best, plain PySpark (bench/spark_once_bare.py): the same file
     source and schema, Delta's streaming sink, ``availableNow``, its own checkpoint, the same jars
     from the same Ivy cache on the class path and mqd's session settings;
   - ``probe`` (``--probe``): mqd's CLI with a stopwatch on each step of the job
     (bench/spark_once_probe.py), for where the time goes.
3. **Catch-up**: every pipeline's first run lands the whole landing into its table (run again until
   its table holds every landed record; ``--workdir`` keeps the tables for a later invocation).
4. **Rounds** (``--runs``, default 5): per size, one new file per partition is landed, then every
   pipeline runs once on that **increment**, then once more with nothing new (**up to date**), the
   pipeline order rotated each round, so a burst of load from other work hits them all alike.
5. **Per run**: wall seconds from spawn to exit; CPU seconds of the process tree (the Python process
   from ``wait4``, Spark's JVM too: pyspark never waits for it, so this process is the children's
   subreaper and reaps it); when the JVM printed its first line, when Ivy's resolution ended, when the
   query started and ended (from the process's output); the 1-minute load average before it. Every
   run must exit 0 and report the rows expected (an increment's 1 file per partition, nothing on an
   up-to-date table); at the end every table must hold every landed record once (delta-rs).
6. **Summary**: median [min-max] per (size, mode, pipeline), and the paired ratio mqd / bare, taken
   round by round.

Results: ``results/spark_once.json`` and ``.md`` (``spark_once-quick.*`` with ``--quick``).

    python -m bench.spark_once                       # 5 rounds, sizes 10 and 100 files per partition
    python -m bench.spark_once --quick               # 2 rounds, sizes 5 and 20: does it all still run
    python -m bench.spark_once --variant before=/tmp/mqd-before --probe --workdir /tmp/so
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    bare_spark_conf,
    become_subreaper,
    fmt_range,
    machine_facts,
    package_versions,
    replace_block,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
BARE = Path(__file__).resolve().parent / "spark_once_bare.py"
PROBE = Path(__file__).resolve().parent / "spark_once_probe.py"
README = Path(__file__).resolve().parent / "README.md"
README_BEGIN = "<!-- spark_once:begin -->"
README_END = "<!-- spark_once:end -->"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z: file f of a partition holds hour f
RUN_TIMEOUT_S = 900.0
REAP_TIMEOUT_S = 60.0  # for the JVM to exit once its Python is gone (it reads EOF on its stdin)

# (phase, pattern of the output line that ends it); the first match counts
PHASES: list[tuple[str, re.Pattern[str]]] = [
    ("jvm_up", re.compile(r"Using incubator modules|Ivy Default Cache")),
    ("ivy_done", re.compile(r"artifacts copied, \d+ already retrieved")),
    ("session", re.compile(r"probe open_session |bare_session")),
    ("query_started", re.compile(r"spark_query_started|bare_started")),
    ("query_done", re.compile(r'"spark_query_done"|bare_done')),
]
_PROBE_LINE = re.compile(r"probe (\S+) start=([\d.]+) seconds=([\d.]+)")
_MQD_ROWS = re.compile(r'"rows": (\d+|null), "event": "spark_query_done"')
_BARE_ROWS = re.compile(r"bare_done rows=(\S+)")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the landing and the configs


def land(landing: Path, partitions: int, first_file: int, files: int, records: int) -> None:
    """``files`` files of ``records`` records into each partition of topic ``events``, file ``f``
    of a partition holding offsets ``f*records..`` stamped in hour ``f`` (tests/support/delta.py)."""
    import numpy as np
    import pyarrow as pa

    from mqd.landing import LocalStore, Publisher
    from mqd.wire import format as fmt

    pub = Publisher(LocalStore(landing))
    pub.store.open()
    for p in range(partitions):
        for f in range(first_file, first_file + files):
            values = [b"v%d" % i for i in range(records)]
            ts = np.full(records, T0 + f * 3_600_000, dtype=np.int64)
            raw = fmt.encode_batch(values, timestamps=ts, base_offset=f * records)
            batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
            pub.publish("events", p, pa.Table.from_batches([batch]), pub.store.head("events", p).last_offset)


def table_dir(size_dir: Path, pipeline: str) -> Path:
    """A pipeline's table; its own name, since the query's name (and its lifecycle record in the
    landing) is ``mqd-<table>``."""
    return size_dir / pipeline / f"{pipeline}-events"


def mqd_config(size_dir: Path, pipeline: str, partitions: int) -> Path:
    """The job's config: defaults, except one file per partition per batch (max_files_per_trigger)."""
    from mqd.testing import to_toml

    out = size_dir / pipeline
    out.mkdir(parents=True, exist_ok=True)
    path = out / "mqd.toml"
    spark = {
        "output_dir": str(table_dir(size_dir, pipeline)),
        "checkpoint_dir": str(out / "ckpt"),
        "quarantine_dir": str(out / "quarantine"),
        "max_files_per_trigger": partitions,
    }
    path.write_text(to_toml({"landing": {"dir": str(size_dir / "landing")}, "spark": spark}))
    return path


def bare_argv(size_dir: Path, partitions: int, workdir: Path) -> list[str]:
    """The plain-PySpark alternative with mqd's session settings and the same jars."""
    from mqd.config import SparkConfig
    from mqd.spark.source_schema import source_ddl

    sc = SparkConfig()
    out = size_dir / "bare"
    conf = bare_spark_conf(workdir, {"spark.sql.streaming.schemaInference": "false"})
    argv = [
        sys.executable,
        str(BARE),
        "--landing",
        str(size_dir / "landing"),
        "--output",
        str(table_dir(size_dir, "bare")),
        "--checkpoint",
        str(out / "ckpt" / "main"),
        "--ddl",
        source_ddl(),
        "--max-files",
        str(partitions),
        "--partition-by",
        ",".join(sc.partition_by),
        "--master",
        sc.master,
    ]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return argv


# ---------------------------------------------------------------------------------------------
# one run: a process tree, timed


@dataclass
class Run:
    pipeline: str
    size: int
    mode: str  # "catch-up", "increment", "up-to-date"
    round: int
    wall_s: float
    cpu_s: float  # the Python process and every descendant it left behind (the JVM)
    exit_code: int
    rows: int | None
    load_1m: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds from spawn
    steps: dict[str, list[float]] = field(default_factory=dict)  # probe: step -> [start, seconds]
    log: str = ""


def _reap_orphans(deadline: float) -> float:
    """Wait for every remaining child (the reparented JVM) until ``deadline``; their CPU seconds."""
    cpu = 0.0
    while True:
        try:
            pid, _status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return cpu
        if pid == 0:
            if time.monotonic() > deadline:
                log("  (a descendant is still running after the run: its CPU is not counted)")
                return cpu
            time.sleep(0.05)
            continue
        cpu += ru.ru_utime + ru.ru_stime


def timed_run(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    *,
    pipeline: str,
    size: int,
    mode: str,
    rnd: int,
) -> Run:
    """One run of ``argv`` in ``cwd``: with ``python -m`` the working directory comes first on
    ``sys.path``, before ``PYTHONPATH``, so a variant's tree must be its working directory too."""
    load = os.getloadavg()[0]
    lines: list[tuple[float, str]] = []
    start_epoch = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    out = proc.stdout

    def read() -> None:
        for line in out:
            lines.append((time.monotonic() - t0, line.rstrip("\n")))

    reader = threading.Thread(target=read, name="run-output", daemon=True)
    reader.start()
    deadline = t0 + RUN_TIMEOUT_S
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.02)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = ru.ru_utime + ru.ru_stime + _reap_orphans(time.monotonic() + REAP_TIMEOUT_S)
    reader.join(10)
    text = "\n".join(f"{t:8.3f} {line}" for t, line in lines)
    log_path.write_text(text + "\n")
    phases: dict[str, float] = {}
    steps: dict[str, list[float]] = {}
    rows: int | None = None
    for t, line in lines:
        for name, pattern in PHASES:
            if name not in phases and pattern.search(line):
                phases[name] = round(t, 3)
        m = _PROBE_LINE.search(line)
        if m:
            step_start = round(float(m.group(2)) - start_epoch, 3)
            prior = steps.get(m.group(1))
            if prior is None:
                steps[m.group(1)] = [step_start, float(m.group(3))]
            else:  # a step that runs more than once (the batch log's polls): its total
                prior[1] = round(prior[1] + float(m.group(3)), 3)
        m = _MQD_ROWS.search(line) or _BARE_ROWS.search(line)
        if m and m.group(1).isdigit():
            rows = (rows or 0) + int(m.group(1))
        elif m and rows is None:
            rows = 0
    phases["exit"] = round(wall, 3)
    return Run(
        pipeline=pipeline,
        size=size,
        mode=mode,
        round=rnd,
        wall_s=round(wall, 3),
        cpu_s=round(cpu, 3),
        exit_code=proc.returncode,
        rows=rows,
        load_1m=round(load, 2),
        phases=phases,
        steps=steps,
        log=str(log_path),
    )


# ---------------------------------------------------------------------------------------------
# the benchmark


@dataclass(frozen=True)
class Pipeline:
    name: str
    kind: str  # "mqd", "probe", "bare"
    tree: Path | None  # mqd's checkout (PYTHONPATH) for mqd and probe

    def argv(self, size_dir: Path, partitions: int, workdir: Path) -> list[str]:
        if self.kind == "bare":
            return bare_argv(size_dir, partitions, workdir)
        cfg = mqd_config(size_dir, self.name, partitions)
        if self.kind == "probe":
            return [sys.executable, str(PROBE), "spark", "--once", "-c", str(cfg)]
        return [sys.executable, "-m", "mqd.operator.cli", "spark", "--once", "-c", str(cfg)]

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        return env


def table_rows(table: Path) -> int:
    """Records in a Delta table, by delta-rs (the log's add actions)."""
    from deltalake import DeltaTable

    adds = DeltaTable(str(table)).get_add_actions(flatten=True)
    total: int = sum(v or 0 for v in adds.column("num_records").to_pylist())
    return total


class Bench:
    def __init__(self, args: argparse.Namespace, pipelines: list[Pipeline]) -> None:
        self.args = args
        self.pipelines = pipelines
        self.workdir: Path = args.workdir
        self.runs: list[Run] = []
        self.catch_up: list[Run] = []
        self.files: dict[int, int] = {}  # size -> files landed per partition

    def size_dir(self, size: int) -> Path:
        return self.workdir / f"files-{size}"

    def landed_files(self, size: int) -> int:
        """Files per partition in the size's landing (the least of any partition)."""
        counts = [0] * self.args.partitions
        for path in (self.size_dir(size) / "landing").glob("topic=events/dt=*/hour=*/part-*.parquet"):
            counts[int(path.name.split("-")[1])] += 1
        return min(counts)

    def prepare(self, size: int) -> None:
        a = self.args
        have = self.landed_files(size)
        if have < size:
            land(self.size_dir(size) / "landing", a.partitions, have, size - have, a.records)
        self.files[size] = self.landed_files(size)
        for p in self.pipelines:
            if not self._table_ok(p, size) and self._seed(p, size):
                continue
            for attempt in range(3):
                if self._table_ok(p, size):
                    break
                run = self.run(p, size, "catch-up", -1 - attempt)
                self.catch_up.append(run)
                log(f"  catch-up {p.name} files={size}: {run.wall_s:.1f} s, exit {run.exit_code}")
                if run.exit_code != 0:
                    raise SystemExit(f"{p.name}'s catch-up failed: see {run.log}")
            else:
                raise SystemExit(f"{p.name}'s table for {size} files is not caught up after 3 runs")

    def _seed(self, p: Pipeline, size: int) -> bool:
        """A copy of another mqd pipeline's caught-up table and checkpoint: every mqd tree runs the
        same query, and a table of many versions takes a batch per version to build. The query id
        (checkpoint and table alike) comes along; the lifecycle record is the copy's own."""
        if p.kind == "bare":
            return False
        for q in self.pipelines:
            if q.kind == "bare" or q == p or not self._table_ok(q, size):
                continue
            src, dst = self.size_dir(size) / q.name, self.size_dir(size) / p.name
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
            (dst / table_dir(src, q.name).name).rename(table_dir(self.size_dir(size), p.name))
            log(f"  {p.name} files={size}: a copy of {q.name}'s table and checkpoint")
            return self._table_ok(p, size)
        return False

    def expected_rows(self, size: int) -> int:
        return int(self.args.partitions * self.files[size] * self.args.records)

    def _table_ok(self, p: Pipeline, size: int) -> bool:
        table = table_dir(self.size_dir(size), p.name)
        if not (table / "_delta_log").is_dir():
            return False
        return table_rows(table) == self.expected_rows(size)

    def run(self, p: Pipeline, size: int, mode: str, rnd: int) -> Run:
        size_dir = self.size_dir(size)
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stem = f"{p.name}-{size}-{mode}-{rnd}-{int(time.time())}"
        return timed_run(
            p.argv(size_dir, self.args.partitions, self.workdir),
            p.env(),
            p.tree or ROOT,
            logs / f"{stem}.log",
            pipeline=p.name,
            size=size,
            mode=mode,
            rnd=rnd,
        )

    def round(self, rnd: int) -> None:
        a = self.args
        for size in a.sizes:
            land(self.size_dir(size) / "landing", a.partitions, self.files[size], 1, a.records)
            self.files[size] += 1
            k = rnd % len(self.pipelines)
            order = self.pipelines[k:] + self.pipelines[:k]
            for mode, expect in (("increment", a.partitions * a.records), ("up-to-date", 0)):
                for p in order:
                    run = self.run(p, size, mode, rnd)
                    self.runs.append(run)
                    log(
                        f"  round {rnd} files={size} {mode:10} {p.name:8} {run.wall_s:6.1f} s wall "
                        f"{run.cpu_s:6.1f} s CPU load {run.load_1m:.2f} rows {run.rows} exit {run.exit_code}"
                    )
                    if run.exit_code != 0 or run.rows != expect:
                        raise SystemExit(
                            f"{p.name} {mode}: exit {run.exit_code} rows {run.rows} (want {expect}) {run.log}"
                        )

    def verify(self) -> dict[str, bool]:
        out = {}
        for size in self.args.sizes:
            for p in self.pipelines:
                table = table_dir(self.size_dir(size), p.name)
                out[f"{p.name}/{size}"] = table_rows(table) == self.expected_rows(size)
        return out


def _median_range(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def summarize(runs: list[Run], pipelines: list[Pipeline], sizes: list[int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    bare = {(r.size, r.mode, r.round): r for r in runs if r.pipeline == "bare"}
    for size in sizes:
        for mode in ("up-to-date", "increment"):
            for p in pipelines:
                mine = [r for r in runs if r.pipeline == p.name and r.size == size and r.mode == mode]
                if not mine:
                    continue
                phases = sorted({k for r in mine for k in r.phases})
                steps = sorted({k for r in mine for k in r.steps})
                row: dict[str, Any] = {
                    "size": size,
                    "mode": mode,
                    "pipeline": p.name,
                    "runs": len(mine),
                    "wall_s": _median_range([r.wall_s for r in mine]),
                    "cpu_s": _median_range([r.cpu_s for r in mine]),
                    "load_1m": _median_range([r.load_1m for r in mine]),
                    "phases": {
                        k: _median_range([r.phases[k] for r in mine if k in r.phases]) for k in phases
                    },
                    "steps": {
                        k: {
                            "start": _median_range([r.steps[k][0] for r in mine if k in r.steps]),
                            "seconds": _median_range([r.steps[k][1] for r in mine if k in r.steps]),
                        }
                        for k in steps
                    },
                }
                if p.kind != "bare":
                    ratios = [
                        r.wall_s / bare[(r.size, r.mode, r.round)].wall_s
                        for r in mine
                        if (r.size, r.mode, r.round) in bare
                    ]
                    if ratios:
                        row["wall_ratio_to_bare"] = _median_range([round(x, 3) for x in ratios])
                rows.append(row)
    return rows


def render_md(result: dict[str, Any]) -> str:
    m = result["machine"]
    args = result["args"]
    lines = [
        f"Run {m['time_utc']} on {m['cores']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Python "
        f"{m['python']}, pyspark {result['versions'].get('pyspark')}, delta-spark "
        f"{result['versions'].get('delta-spark')}; {args['partitions']} partitions x {args['records']} "
        f"records per file, one file per partition per batch; {args['runs']} rounds, pipelines "
        f"interleaved. Medians [min-max]; load is the 1-minute load average before each run.",
        "",
        "| table (files per partition) | run | pipeline | wall s | CPU s (tree) | JVM up s | Ivy done s | "
        "query started s | query done s | mqd / bare (wall, paired) | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["summary"]:
        ph = row["phases"]

        def cell(key: str, ph: dict[str, Any] = ph) -> str:
            return fmt_range(ph[key]) if key in ph else "-"

        ratio = fmt_range(row["wall_ratio_to_bare"], 2) if "wall_ratio_to_bare" in row else "-"
        lines.append(
            f"| {row['size']} (+ rounds) | {row['mode']} | {row['pipeline']} | {fmt_range(row['wall_s'])} | "
            f"{fmt_range(row['cpu_s'])} | {cell('jvm_up')} | {cell('ivy_done')} | {cell('query_started')} | "
            f"{cell('query_done')} | {ratio} | {fmt_range(row['load_1m'], 2)} |"
        )
    probe_rows = [r for r in result["summary"] if r["steps"]]
    if probe_rows:
        lines += [
            "",
            "Where a probe run's time goes (bench/spark_once_probe.py; start s from spawn, then seconds):",
            "",
        ]
        for row in probe_rows:
            order = sorted(row["steps"].items(), key=lambda kv: kv[1]["start"]["median"])
            parts = [f"{k} @{v['start']['median']:.1f} {v['seconds']['median']:.2f}" for k, v in order]
            lines.append(f"- {row['size']} files, {row['mode']}: " + "; ".join(parts))
    ok = result["exact"]
    lines += ["", f"Every table holds every landed record once (delta-rs): {all(ok.values())} ({ok})"]
    catch = result["catch_up"]
    if catch:
        lines.append(
            "Catch-up runs (whole landing, one batch per file per partition): "
            + "; ".join(f"{c['pipeline']} {c['size']} files {c['wall_s']:.0f} s" for c in catch)
        )
    return "\n".join(lines) + "\n"


def update_readme(md: str) -> None:
    replace_block(README, README_BEGIN, README_END, md)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_once", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--sizes", default="10,100", help="files per partition of each table (default 10,100)")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--records", type=int, default=100, help="records per file")
    ap.add_argument("--quick", action="store_true", help="2 rounds, sizes 5,20 (seconds, not a measurement)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="name=tree: also run mqd from this checkout (default: mqd=this one only)",
    )
    ap.add_argument("--no-bare", action="store_true", help="leave out the plain-PySpark alternative")
    ap.add_argument("--probe", action="store_true", help="also run mqd with a stopwatch on each step")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the landings and tables here (reused)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite bench/README.md's table")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.sizes = min(args.runs, 2), "5,20"
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    become_subreaper()
    pipelines = [Pipeline("mqd", "mqd", ROOT)]
    for spec in args.variant:
        name, _, tree = spec.partition("=")
        if name in {"bare", "probe", "mqd"} and tree:
            pipelines = [p for p in pipelines if p.name != name]
        pipelines.append(Pipeline(name, "mqd", Path(tree or ".").resolve()))
    if args.probe:
        pipelines.append(Pipeline("probe", "probe", ROOT))
    if not args.no_bare:
        pipelines.append(Pipeline("bare", "bare", None))
    temp = None
    if args.workdir is None:
        temp = tempfile.mkdtemp(prefix="mqd-spark-once-")
        args.workdir = Path(temp)
    args.workdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, pipelines)
    try:
        for size in args.sizes:
            log(f"preparing {args.partitions} partitions x {size} files in {bench.size_dir(size)}")
            bench.prepare(size)
        for rnd in range(args.runs):
            bench.round(rnd)
        exact = bench.verify()
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    result: dict[str, Any] = {
        "benchmark": "spark_once",
        "machine": machine_facts(),
        "versions": package_versions(("pyspark", "delta-spark", "deltalake")),
        "args": {
            "runs": args.runs,
            "sizes": args.sizes,
            "partitions": args.partitions,
            "records": args.records,
            "pipelines": [{"name": p.name, "kind": p.kind, "tree": str(p.tree)} for p in pipelines],
        },
        "summary": summarize(bench.runs, pipelines, args.sizes),
        "exact": exact,
        "catch_up": [asdict(r) for r in bench.catch_up],
        "runs": [asdict(r) for r in bench.runs],
    }
    stem = "spark_once-quick" if args.quick else "spark_once"
    write_json(args.out / f"{stem}.json", result)
    md = render_md(result)
    (args.out / f"{stem}.md").write_text(md)
    if not args.quick and not args.no_readme and args.out == RESULTS:
        update_readme(md)
    print(md)
    return 0 if all(exact.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
