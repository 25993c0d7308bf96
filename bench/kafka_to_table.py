"""``python -m bench.kafka_to_table``: Kafka to a readable Delta table, mqd against Spark's own
Kafka source (issue 28).

One Apache Kafka broker (``mqd.testing.KafkaCluster``, KRaft, on 127.0.0.1) gets, per size, a topic
of ``--partitions`` (12) partitions and N records of 100 B, produced once with confluent-kafka as
the other Kafka benchmarks do. Then, ``--rounds`` interleaved rounds (the order rotated each round,
so a burst of load from other work hits both alike), each pipeline into a fresh table:

- **mqd**: ``mqd run --burst`` (``consumer.source = "kafka"``, broadcast mode: every partition,
  offsets in its own file, as the Spark source assigns every partition without a group) into a
  fresh landing, then ``mqd spark --once`` into a fresh Delta table; every other setting the
  daemon's and the job's default. Its time is the two processes' together.
- **spark**: plain PySpark (bench/kafka_to_table_spark.py): ``readStream.format("kafka")`` from the
  earliest offsets, no ``maxOffsetsPerTrigger``, Delta's sink with ``trigger(availableNow=True)``,
  the same jars on the class path (the recorded resolution of mqd's package set, which holds
  ``spark-sql-kafka-0-10``), tuned as below (``SPARK_TUNING``).

Per run: wall seconds from spawn to exit, CPU seconds of the process tree (Spark's JVM included:
this process is the subreaper that reaps it when pyspark's Python leaves it behind), the peak RSS
of the tree (the sum over its processes, sampled every 0.1 s), the broker's CPU seconds over it.
Exactness: the table, read by delta-rs, holds exactly offsets 0..n-1 of every partition once.

**Latency** (``--latency-rate`` 50,000 records/s for ``--latency-seconds`` 30 s, each pipeline on
a topic of its own, one after the other): (a) ``mqd run`` (landing ``max_age`` 1 s) with a
streaming ``mqd spark`` (trigger 1 s), (b) the Spark script on a 1 s processing-time trigger. Both
are up before the producer starts. A poller reads the table's version with delta-rs every
``POLL_S``; for each new version, the records it added (``dataChange`` adds) are queryable from the
moment the poll saw it: produce-to-queryable = that moment minus the record's Kafka timestamp
(CreateTime, set by the producer). The commit file's own time is reported beside it.

Results: ``results/kafka_to_table.json`` and ``.md`` (``kafka_to_table-quick.*`` with ``--quick``),
and the section between the ``kafka_to_table`` markers of bench/README.md.

    python -m bench.kafka_to_table                     # sizes 1M and 4M, 3 rounds, latency
    python -m bench.kafka_to_table --quick             # 100k records, 1 round, 5 s of latency
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import (
    RESULTS,
    Workload,
    bare_spark_conf,
    become_subreaper,
    fmt_range,
    machine_facts,
    package_versions,
    process_cpu_seconds,
    replace_block,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
BARE = Path(__file__).resolve().parent / "kafka_to_table_spark.py"
README = Path(__file__).resolve().parent / "README.md"
README_BEGIN = "<!-- kafka_to_table:begin -->"
README_END = "<!-- kafka_to_table:end -->"
RUN_TIMEOUT_S = 1800.0
REAP_TIMEOUT_S = 60.0  # for the JVM to exit once its Python is gone (it reads EOF on its stdin)
POLL_S = 0.05  # the latency poller's interval: its granularity is part of what it measures
WARM_UP_PER_PARTITION = 1000  # records per partition before the latency part's measured producer
VALUE_SIZE = 100

# The broker for a benchmark, not for a test: KafkaCluster's default flags (C1 only, 256 MB heap)
# buy a fast start; here one broker serves every run, so C2 and a larger heap are what a deployment
# would give it (both pipelines read the same broker, so this favours neither).
BROKER_JVM_FLAGS = (
    "-Xmx1g",
    "-XX:+UseSerialGC",
    "-Xshare:auto",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

# Spark's Kafka source at its best here (chosen by measuring on this machine, bench/README.md):
# the consumer's fetch sizes raised as for the other benchmarks' Kafka clients (librdkafka and
# aiokafka got 64 MiB / 8 MiB); Spark's defaults are the Java client's 50 MiB / 1 MiB
SPARK_SOURCE_OPTIONS = {
    "kafka.max.partition.fetch.bytes": str(8 * 2**20),
    "kafka.fetch.max.bytes": str(64 * 2**20),
    "kafka.receive.buffer.bytes": str(2**20),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# pure logic: exactness and latency


def table_inexact(partitions: np.ndarray, offsets: np.ndarray, expected: Sequence[int]) -> str | None:
    """None when (partition, offset) pairs are exactly offsets 0..n-1 of every partition once
    (``expected`` is n per partition); else what is wrong: rows, duplicates, a gap, a foreign one."""
    rows = len(offsets)
    total = int(sum(expected))
    if rows != total:
        return f"{rows} rows, expected {total}"
    parts = np.asarray(partitions, dtype=np.int64)
    offs = np.asarray(offsets, dtype=np.int64)
    for p, n in enumerate(expected):
        mine = offs[parts == p]
        if len(mine) != n:
            return f"partition {p}: {len(mine)} rows, expected {n}"
        distinct = np.unique(mine)
        if len(distinct) != n:
            return f"partition {p}: {n - len(distinct)} duplicate offsets"
        if n and (distinct[0] != 0 or distinct[-1] != n - 1):
            return f"partition {p}: offsets {distinct[0]}..{distinct[-1]}, expected 0..{n - 1}"
    extra = set(np.unique(parts).tolist()) - set(range(len(expected)))
    if extra:
        return f"rows of unexpected partitions {sorted(extra)}"
    return None


@dataclass(frozen=True)
class Commit:
    """One table version as the poller saw it: when (epoch ms) it was first seen, the commit file's
    own time, and the Kafka timestamps (epoch ms) of the records it added."""

    version: int
    seen_ms: float
    commit_ms: float
    timestamps_ms: np.ndarray


def latency_summary(commits: Sequence[Commit], *, expected: int | None = None) -> dict[str, Any]:
    """produce-to-queryable per record: a record is queryable from the moment its commit was seen,
    so its latency is ``seen_ms - timestamp``; beside it ``commit_ms - timestamp`` (the commit
    file's time, without the poller's granularity). p50, p99, max in ms over every record, and how
    many records and commits there were (``expected``: how many were produced)."""
    seen = [c.seen_ms - c.timestamps_ms for c in commits if len(c.timestamps_ms)]
    commit = [c.commit_ms - c.timestamps_ms for c in commits if len(c.timestamps_ms)]
    if not seen:
        return {"records": 0, "commits": 0, "expected": expected}
    a = np.concatenate(seen)
    b = np.concatenate(commit)
    out: dict[str, Any] = {
        "records": len(a),
        "commits": sum(1 for c in commits if len(c.timestamps_ms)),
        "expected": expected,
    }
    for name, arr in (("queryable", a), ("commit", b)):
        out[f"{name}_p50_ms"] = round(float(np.percentile(arr, 50)), 1)
        out[f"{name}_p99_ms"] = round(float(np.percentile(arr, 99)), 1)
        out[f"{name}_max_ms"] = round(float(arr.max()), 1)
    return out


def spread(values: Sequence[float], digits: int = 1) -> dict[str, float] | None:
    """median, min and max of ``values`` (None when empty)."""
    if not values:
        return None
    return {
        "median": round(float(statistics.median(values)), digits),
        "min": round(float(min(values)), digits),
        "max": round(float(max(values)), digits),
    }


# ---------------------------------------------------------------------------------------------
# a process tree, timed


@dataclass
class TreeRun:
    name: str
    wall_s: float
    cpu_s: float  # the process and every descendant (the JVM pyspark leaves behind)
    peak_rss_mb: float  # the highest sum of RSS over the tree's live processes, sampled
    exit_code: int
    started_at: float  # epoch seconds at spawn
    log: str
    broker_cpu_s: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)  # pattern name -> seconds from spawn


class TreeProcess:
    """A command and its descendants: spawn, wait for an output line, stop, and the figures. Only
    the pids it saw are reaped (the broker is this process's child too and must be left alone)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        log_path: Path,
        env: dict[str, str] | None = None,
        marks: dict[str, re.Pattern[str]] | None = None,
        broker_pids: list[int] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        self.patterns = marks or {}
        self.marks: dict[str, float] = {}
        self.broker_pids = broker_pids or []
        self._seen: dict[int, psutil.Process] = {}
        self._cpu: dict[int, float] = {}  # pid -> its own CPU seconds at the last sample
        self._peak = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> TreeProcess:
        self.broker_cpu0 = process_cpu_seconds(self.broker_pids)
        self.started_at = time.time()
        self.t0 = time.monotonic()
        self._out = open(self.log_path, "w")  # closed by finish()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-out", daemon=True)
        self._reader.start()
        self._sampler = threading.Thread(target=self._sample, name=f"{self.name}-rss", daemon=True)
        self._sampler.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t = time.monotonic() - self.t0
            self._out.write(f"{t:8.3f} {line}")
            self._out.flush()
            for key, pattern in self.patterns.items():
                if key not in self.marks and pattern.search(line):
                    self.marks[key] = round(t, 3)

    def _sample(self) -> None:
        root = psutil.Process(self.proc.pid)
        self._seen[root.pid] = root
        while not self._stop.wait(0.1):
            try:
                for child in root.children(recursive=True):
                    self._seen.setdefault(child.pid, child)
            except psutil.Error:
                pass
            self._sample_tree()

    def _sample_tree(self) -> None:
        total = 0.0
        for p in list(self._seen.values()):
            try:
                total += p.memory_info().rss / 2**20
                times = p.cpu_times()
                with self._lock:
                    self._cpu[p.pid] = times.user + times.system
            except psutil.Error:
                continue
        self._peak = max(self._peak, total)

    def cpu_mark(self) -> dict[int, float]:
        """The tree's CPU seconds per process now (for ``cpu_since``)."""
        self._sample_tree()
        with self._lock:
            return dict(self._cpu)

    def cpu_since(self, mark: dict[int, float]) -> float:
        """CPU seconds the tree used since ``mark``: per process, its last sample (every 0.1 s; a
        process that exited keeps its last one) less its CPU at the mark (0 if born since)."""
        self._sample_tree()
        with self._lock:
            return sum(max(0.0, cpu - mark.get(pid, 0.0)) for pid, cpu in self._cpu.items())

    def wait_mark(self, key: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while key not in self.marks:
            # waitid with WNOWAIT: an exit is seen without reaping it (finish() takes its rusage)
            if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                raise RuntimeError(f"{self.name} exited before {key}: {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no {key} after {timeout} s: {self.log_path}")
            time.sleep(0.05)

    def finish(self, timeout: float = RUN_TIMEOUT_S, *, terminate: bool = False) -> TreeRun:
        """Wait for the process to exit (SIGTERM first with ``terminate``; SIGKILL after
        ``timeout``), reap the descendants it left behind; its figures."""
        # os.kill, not Popen.send_signal/kill: those poll() first, which would reap the process
        # and lose its rusage (a process that exited is a zombie until wait4 below: no pid reuse)
        if terminate:
            os.kill(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.proc.pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
        wall = time.monotonic() - self.t0
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        cpu = ru.ru_utime + ru.ru_stime + self._reap(time.monotonic() + REAP_TIMEOUT_S)
        self._stop.set()
        self._sampler.join(2)
        self._reader.join(10)
        self._out.close()
        return TreeRun(
            name=self.name,
            wall_s=round(wall, 3),
            cpu_s=round(cpu, 3),
            peak_rss_mb=round(self._peak, 1),
            exit_code=self.proc.returncode,
            started_at=self.started_at,
            log=str(self.log_path),
            broker_cpu_s=round(process_cpu_seconds(self.broker_pids) - self.broker_cpu0, 2),
            marks=dict(self.marks),
        )

    def _reap(self, deadline: float) -> float:
        """The CPU seconds of the descendants reparented to this process (the subreaper), once
        they exit; those that are not its children (reaped by their own parent) count there."""
        cpu = 0.0
        left = {pid for pid in self._seen if pid != self.proc.pid}
        while left:
            for pid in list(left):
                try:
                    got, _status, ru = os.wait4(pid, os.WNOHANG)
                except ChildProcessError:
                    left.discard(pid)
                    continue
                if got:
                    cpu += ru.ru_utime + ru.ru_stime
                    left.discard(pid)
            if left and time.monotonic() > deadline:
                log(f"  ({self.name}: descendants {sorted(left)} still running: their CPU is not counted)")
                break
            time.sleep(0.05)
        return cpu


# ---------------------------------------------------------------------------------------------
# the pipelines

MQD_MARKS = {
    "daemon_started": re.compile(r'"event": "daemon started"'),
    "first_fetch": re.compile(r'"event": "first fetch sent"'),
    "query_started": re.compile(r"spark_query_started"),
}
BARE_MARKS = {"session": re.compile(r"bare_session"), "query_started": re.compile(r"bare_started")}
_BARE_ROWS = re.compile(r"bare_done rows=(\d+)")


def mqd_config(
    path: Path,
    bootstrap: str,
    topic: str,
    run_dir: Path,
    *,
    max_age: float | None,
    trigger: str | None,
    options: dict[str, str] | None = None,
) -> Path:
    """One config for both commands: the daemon's (broadcast mode, its own offset file) and the
    job's; every other setting the defaults, but ``options`` (``section.key`` -> a TOML value)."""
    from mqd.testing import daemon_section, to_toml

    state = run_dir / "state"
    landing: dict[str, Any] = {"dir": str(run_dir / "landing")}
    if max_age is not None:
        landing["max_age"] = max_age
    spark: dict[str, Any] = {
        "output_dir": str(run_dir / "table"),
        "checkpoint_dir": str(run_dir / "ckpt"),
        "quarantine_dir": str(run_dir / "quarantine"),
    }
    if trigger is not None:
        spark["trigger_interval"] = trigger
    doc: dict[str, Any] = {
        "consumer": {
            "source": "kafka",
            "group": f"bench-{run_dir.name}",
            "client_id": f"bench-{run_dir.name}",
            "bootstrap": [bootstrap],
            "topics": [topic],
            "consume_from": "first",
            "mode": "broadcast",
            "offset_file": str(state / "offsets.json"),
        },
        "landing": landing,
        "spark": spark,
        # port 0: the default port may be another daemon's on a shared machine
        "admin": {"enabled": True, "host": "127.0.0.1", "port": 0},
        "log": {"level": "info", "format": "json"},
        "daemon": daemon_section(state),
    }
    for dotted, value in (options or {}).items():
        *sections, key = dotted.split(".")
        at = doc
        for section in sections:
            at = at.setdefault(section, {})
        at[key] = tomllib.loads(f"v = {value}")["v"]
    path.write_text(to_toml(doc))
    return path


def mqd_argv(command: str, config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mqd.operator.cli", command, "--config", str(config), *extra]


def spark_conf(workdir: Path, tuning: dict[str, str]) -> dict[str, str]:
    """The bare script's session: mqd's session settings (the same as bench/spark_once.py's bare
    run) with ``tuning`` over them."""
    return bare_spark_conf(workdir, tuning)


def bare_argv(
    bootstrap: str,
    topic: str,
    run_dir: Path,
    conf: dict[str, str],
    options: dict[str, str],
    *,
    trigger: str = "availableNow",
) -> list[str]:
    argv = [
        sys.executable,
        str(BARE),
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--output",
        str(run_dir / "table"),
        "--checkpoint",
        str(run_dir / "ckpt"),
        "--trigger",
        trigger,
    ]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    for key, value in options.items():
        argv += ["--option", f"{key}={value}"]
    return argv


def read_table(table: Path) -> tuple[np.ndarray, np.ndarray]:
    """(partition, offset) of every row of the Delta table, read by delta-rs."""
    from deltalake import DeltaTable

    t = DeltaTable(str(table)).to_pyarrow_table(columns=["partition", "offset"])
    return t.column("partition").to_numpy(), t.column("offset").to_numpy()


# ---------------------------------------------------------------------------------------------
# the benchmark


class Bench:
    def __init__(self, args: argparse.Namespace, kafka: Any) -> None:
        self.args = args
        self.kafka = kafka
        self.workdir: Path = args.workdir
        self.broker_pids = [b.pid for b in kafka.brokers if b.pid]
        self.conf = spark_conf(self.workdir, args.spark_tuning)
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def _fresh(self, name: str) -> Path:
        d = self.workdir / "runs" / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def check(self, table: Path, work: Workload) -> str | None:
        try:
            parts, offs = read_table(table)
        except Exception as exc:  # delta-rs raises its own types; a missing table is inexact
            return f"unreadable table: {exc}"
        return table_inexact(parts, offs, work.per_partition())

    def run_mqd(self, topic: str, work: Workload, tag: str) -> dict[str, Any]:
        d = self._fresh(f"mqd-{tag}")
        cfg = mqd_config(
            d / "mqd.toml",
            self.kafka.bootstrap,
            topic,
            d,
            max_age=None,
            trigger=None,
            options=self.args.mqd_options,
        )
        runs = []
        for step, argv in (
            ("run", mqd_argv("run", cfg, "--burst")),
            ("spark", mqd_argv("spark", cfg, "--once")),
        ):
            tp = TreeProcess(
                f"mqd-{step}",
                argv,
                log_path=self.logs / f"mqd-{step}-{tag}.log",
                marks=MQD_MARKS,
                broker_pids=self.broker_pids,
            )
            r = tp.start().finish()
            runs.append(r)
            if r.exit_code != 0:
                return {"pipeline": "mqd", "error": f"mqd {step} exit {r.exit_code}: {r.log}"}
        wrong = self.check(d / "table", work)
        out = self._figures("mqd", work, runs, wrong)
        out["steps"] = {r.name: asdict(r) for r in runs}
        if wrong is None and not self.args.keep:
            shutil.rmtree(d, ignore_errors=True)
        return out

    def run_spark(self, topic: str, work: Workload, tag: str) -> dict[str, Any]:
        d = self._fresh(f"spark-{tag}")
        argv = bare_argv(self.kafka.bootstrap, topic, d, self.conf, self.args.source_options)
        tp = TreeProcess(
            "spark",
            argv,
            log_path=self.logs / f"spark-{tag}.log",
            marks=BARE_MARKS,
            broker_pids=self.broker_pids,
        )
        r = tp.start().finish()
        if r.exit_code != 0:
            return {"pipeline": "spark", "error": f"spark exit {r.exit_code}: {r.log}"}
        wrong = self.check(d / "table", work)
        out = self._figures("spark", work, [r], wrong)
        out["steps"] = {"spark": asdict(r)}
        if wrong is None and not self.args.keep:
            shutil.rmtree(d, ignore_errors=True)
        return out

    @staticmethod
    def _figures(name: str, work: Workload, runs: list[TreeRun], wrong: str | None) -> dict[str, Any]:
        wall = sum(r.wall_s for r in runs)
        cpu = sum(r.cpu_s for r in runs)
        broker = sum(r.broker_cpu_s for r in runs)
        m = work.records / 1e6
        return {
            "pipeline": name,
            "records": work.records,
            "exact": wrong is None,
            "inexact": wrong,
            "wall_s": round(wall, 2),
            "records_per_s": round(work.records / wall),
            "cpu_s": round(cpu, 2),
            "cpu_s_per_m": round(cpu / m, 2),
            "broker_cpu_s": round(broker, 2),
            "cpu_s_per_m_with_broker": round((cpu + broker) / m, 2),
            "peak_rss_mb": max(r.peak_rss_mb for r in runs),
            "step_wall_s": {r.name: r.wall_s for r in runs},
            "step_cpu_s": {r.name: r.cpu_s for r in runs},
            "step_peak_rss_mb": {r.name: r.peak_rss_mb for r in runs},
        }

    # -- throughput ---------------------------------------------------------------------------

    def throughput(self, records: int) -> dict[str, Any]:
        from bench import alt_kafka

        a = self.args
        work = Workload(records, VALUE_SIZE, a.partitions, 1000)
        topic = f"events-{records}"
        self.kafka.create_topic(topic, a.partitions)
        produced = alt_kafka.produce(self.kafka.bootstrap, topic, work)
        log(f"size {records:,}: produced at {produced['records_per_s']:,} records/s")
        pipelines: list[tuple[str, Callable[[str, Workload, str], dict[str, Any]]]] = [
            (name, fn)
            for name, fn in (("mqd", self.run_mqd), ("spark", self.run_spark))
            if name in a.pipelines
        ]
        runs = []
        for rnd in range(a.rounds):
            k = rnd % len(pipelines)
            for name, fn in pipelines[k:] + pipelines[:k]:
                load = round(os.getloadavg()[0], 2)
                res = fn(topic, work, f"{records}-{rnd}")
                res.update(round=rnd, load=load)
                runs.append(res)
                if "error" in res:
                    log(f"  round {rnd} {name}: {res['error']}")
                    continue
                log(
                    f"  round {rnd} {name:5} {res['wall_s']:7.1f} s wall "
                    f"({res['records_per_s']:,} records/s) "
                    f"CPU {res['cpu_s']:.1f} s + broker {res['broker_cpu_s']:.1f}, peak RSS "
                    f"{res['peak_rss_mb']:.0f} MB, exact {res['exact']}"
                    + (f" ({res['inexact']})" if res["inexact"] else "")
                    + f", load {load}"
                )
        self.kafka.delete_topic(topic)
        return {"records": records, "produce": produced, "runs": runs, "summary": summarize(runs)}

    # -- latency ------------------------------------------------------------------------------

    def latency(self, pipeline: str) -> dict[str, Any]:
        a = self.args
        topic = f"latency-{pipeline}"
        self.kafka.create_topic(topic, a.partitions)
        d = self._fresh(f"latency-{pipeline}")
        procs: list[TreeProcess] = []
        if pipeline == "mqd":
            cfg = mqd_config(
                d / "mqd.toml",
                self.kafka.bootstrap,
                topic,
                d,
                max_age=1.0,
                trigger="1s",
                options=a.mqd_options,
            )
            procs.append(
                TreeProcess(
                    "mqd-run",
                    mqd_argv("run", cfg),
                    log_path=self.logs / "latency-mqd-run.log",
                    marks=MQD_MARKS,
                )
            )
            procs.append(
                TreeProcess(
                    "mqd-spark",
                    mqd_argv("spark", cfg),
                    log_path=self.logs / "latency-mqd-spark.log",
                    marks=MQD_MARKS,
                )
            )
            # the job starts once the daemon has made the landing (it refuses a missing one)
            ready = [(procs[0], "first_fetch"), (procs[1], "query_started")]
        else:
            argv = bare_argv(self.kafka.bootstrap, topic, d, self.conf, a.source_options, trigger="1 second")
            procs.append(
                TreeProcess("spark", argv, log_path=self.logs / "latency-spark.log", marks=BARE_MARKS)
            )
            ready = [(procs[0], "query_started")]
        cpu0 = process_cpu_seconds(self.broker_pids)
        warm = WARM_UP_PER_PARTITION * a.partitions
        try:
            for p, mark in ready:
                p.start()
                p.wait_mark(mark, 300)
                if p.name == "mqd-run":
                    # The job starts on a landing that holds a file: before decision 063 a streaming
                    # `mqd spark` started on an empty landing failed its first batch
                    # (PLAN_VALIDATION_FAILED_RULE_IN_BATCH), and an A/B runs older trees too.
                    produce_burst(self.kafka.bootstrap, topic, a.partitions, warm)
                    wait_for(lambda: any((d / "landing").glob("topic=*/**/*.parquet")), 120, "a landed file")
            if pipeline == "spark":
                produce_burst(self.kafka.bootstrap, topic, a.partitions, warm)
            # the table's creation, the first batches' code generation and JIT are start-up, not
            # latency: the warm-up records are in the table before the measured producer starts.
            # A second warm-up: the first batch into an existing table is start-up too (Delta's first
            # snapshot rebuild in the JVM took ~20 s of a loaded 2-core machine, and the measured
            # records queued behind it: decision 063)
            wait_for(lambda: table_rows(d / "table") >= warm, 300, f"{warm} warm-up records in the table")
            produce_burst(self.kafka.bootstrap, topic, a.partitions, warm)
            wait_for(lambda: table_rows(d / "table") >= 2 * warm, 300, f"{2 * warm} warm-up records")
            for p in procs:
                if os.waitid(os.P_PID, p.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    raise RuntimeError(f"{p.name} exited before the producer started: {p.log_path}")
            poller = TablePoller(d / "table")
            poller.start()
            load = round(os.getloadavg()[0], 2)
            # the steady part's CPU: from the producer's start until the table holds its records
            # (start-up and warm-ups left out: the CPU per million records at 50k/s)
            marks = [p.cpu_mark() for p in procs]
            broker_mark = process_cpu_seconds(self.broker_pids)
            produced = produce_steady(
                self.kafka.bootstrap, topic, a.partitions, a.latency_rate, a.latency_seconds
            )
            log(f"  latency {pipeline}: produced {produced['records']:,} at {produced['achieved_per_s']:,}/s")
            # a pipeline that fell behind drains its backlog: the late records count too
            deadline = time.monotonic() + 600
            while poller.records < produced["records"] and time.monotonic() < deadline:
                time.sleep(0.2)
            steady = {p.name: round(p.cpu_since(m), 2) for p, m in zip(procs, marks, strict=True)}
            steady_broker = process_cpu_seconds(self.broker_pids) - broker_mark
            time.sleep(0.5)
            poller.stop()
        finally:
            finished = [p.finish(120, terminate=True) for p in reversed(procs) if hasattr(p, "proc")]
        broker_cpu = process_cpu_seconds(self.broker_pids) - cpu0
        summary = latency_summary(poller.commits, expected=produced["records"])
        summary["poll_errors"] = poller.errors
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
        self.kafka.delete_topic(topic)
        log(f"  latency {pipeline}: {summary}")
        return {
            "pipeline": pipeline,
            "rate": a.latency_rate,
            "seconds": a.latency_seconds,
            "produced": produced,
            "load": load,
            **summary,
            "cpu_s": round(sum(r.cpu_s for r in finished), 2),
            "broker_cpu_s": round(broker_cpu, 2),
            "steady_cpu_s": round(sum(steady.values()), 2),
            "steady_cpu_s_by_process": steady,
            "steady_cpu_s_per_m": round(sum(steady.values()) / max(1, produced["records"]) * 1e6, 2),
            "steady_broker_cpu_s": round(steady_broker, 2),
            "peak_rss_mb": round(sum(r.peak_rss_mb for r in finished), 1),
            "exits": {r.name: r.exit_code for r in finished},
            "poll_s": POLL_S,
        }


def table_rows(table: Path) -> int:
    """Records in a Delta table by its log's add actions (delta-rs); 0 while there is no table."""
    try:
        from deltalake import DeltaTable

        adds = DeltaTable(str(table)).get_add_actions(flatten=True)
    except Exception:  # not created yet
        return 0
    return int(sum(v or 0 for v in adds.column("num_records").to_pylist()))


def produce_burst(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """``records`` records of 100 B at once, round-robin over the partitions (the warm-up)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1})
    for i in range(records):
        producer.produce(topic, b"w" * VALUE_SIZE, partition=i % partitions)
    if producer.flush(60):
        raise RuntimeError("warm-up records not delivered")


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.05)


class TablePoller:
    """Reads the table's version with delta-rs every ``POLL_S``; for each new version the Kafka
    timestamps of the records its ``dataChange`` adds brought (a compaction's rewrite is no new
    data), the moment the poll saw it and the commit file's time."""

    def __init__(self, table: Path) -> None:
        self.table = table
        self.commits: list[Commit] = []
        self.records = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="table-poller", daemon=True)
        self._last = -1
        self.errors = 0

    def start(self) -> None:
        # versions already there (the table's creation, empty batches) are not the producer's
        try:
            from deltalake import DeltaTable

            self._last = DeltaTable(str(self.table)).version()
        except Exception:  # no table yet: every version counts
            self._last = -1
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        from deltalake import DeltaTable

        dt: Any = None
        while not self._stop.wait(POLL_S):
            try:
                if dt is None:
                    dt = DeltaTable(str(self.table))
                else:
                    dt.update_incremental()
                version = dt.version()
            except Exception:  # not created yet
                dt = None
                continue
            seen = time.time() * 1000
            for v in range(self._last + 1, version + 1):
                try:
                    ts, commit_ms = self._records(v)
                except Exception:
                    self.errors += 1
                    continue
                self.commits.append(Commit(v, seen, commit_ms, ts))
                self.records += len(ts)
            self._last = max(self._last, version)

    def _records(self, version: int) -> tuple[np.ndarray, float]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.table / "_delta_log" / f"{version:020d}.json"
        commit_ms = path.stat().st_mtime * 1000
        chunks: list[np.ndarray] = []
        for line in path.read_text().splitlines():
            action = json.loads(line)
            add = action.get("add")
            if not add or not add.get("dataChange", True):
                continue
            from urllib.parse import unquote

            col = pq.read_table(self.table / unquote(add["path"]), columns=["timestamp"]).column("timestamp")
            # Spark writes microseconds, mqd's table may hold milliseconds: epoch ms either way
            per_ms = {"s": 1e-3, "ms": 1.0, "us": 1e3, "ns": 1e6}[col.type.unit]
            chunks.append(col.cast(pa.int64()).to_numpy() / per_ms)
        ts = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.float64)
        return ts.astype(np.float64), commit_ms


def produce_steady(bootstrap: str, topic: str, partitions: int, rate: int, seconds: float) -> dict[str, Any]:
    """``rate`` records/s of 100 B for ``seconds``, round-robin over the partitions, paced in 10 ms
    steps; the producer stamps each record's CreateTime when it is handed over."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "acks": 1,
            "compression.type": "none",
        }
    )
    value = b"x" * VALUE_SIZE
    sent = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - t0) * rate)
        while sent < due:
            producer.produce(topic, value, partition=sent % partitions)
            sent += 1
        producer.poll(0)
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return {"records": sent, "seconds": round(elapsed, 2), "achieved_per_s": round(sent / elapsed)}


# ---------------------------------------------------------------------------------------------
# summary and output


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pipeline: medians [min-max] of the exact runs' figures; the paired ratio of mqd's rate to
    spark's, round by round."""
    out: dict[str, Any] = {}
    for name in ("mqd", "spark"):
        ok = [r for r in runs if r.get("pipeline") == name and "error" not in r]
        out[name] = {
            "runs": len(ok),
            "exact": f"{sum(1 for r in ok if r['exact'])}/{len(ok)}",
            "records_per_s": spread([r["records_per_s"] for r in ok], 0),
            "wall_s": spread([r["wall_s"] for r in ok]),
            "cpu_s_per_m": spread([r["cpu_s_per_m"] for r in ok], 2),
            "cpu_s_per_m_with_broker": spread([r["cpu_s_per_m_with_broker"] for r in ok], 2),
            "peak_rss_mb": spread([r["peak_rss_mb"] for r in ok], 0),
            "load": spread([r["load"] for r in ok], 2),
            "steps_wall_s": {
                k: spread([r["step_wall_s"][k] for r in ok]) for k in (ok[0]["step_wall_s"] if ok else {})
            },
            "steps_peak_rss_mb": {
                k: spread([r["step_peak_rss_mb"][k] for r in ok], 0)
                for k in (ok[0]["step_peak_rss_mb"] if ok else {})
            },
        }
    by_round = {(r["pipeline"], r["round"]): r for r in runs if "error" not in r}
    ratios = [
        by_round[("mqd", rnd)]["records_per_s"] / by_round[("spark", rnd)]["records_per_s"]
        for (name, rnd) in by_round
        if name == "mqd" and ("spark", rnd) in by_round
    ]
    out["ratio_mqd_to_spark"] = spread(ratios, 2)
    return out


def render_md(result: dict[str, Any]) -> str:
    m = result["machine"]
    a = result["args"]
    v = result["versions"]
    lines = [
        f"Run {m['time_utc']} on {m['cores']} cores ({m['cpu_model']}), {m['memory_gib']} GiB, Python "
        f"{m['python']}; Apache Kafka {v.get('kafka')} (1 broker, KRaft, 127.0.0.1), pyspark "
        f"{v.get('pyspark')}, delta-spark {v.get('delta-spark')}, deltalake {v.get('deltalake')}; "
        f"{a['partitions']} partitions, {VALUE_SIZE} B values; {a['rounds']} rounds, pipelines interleaved. "
        "Medians [min-max]; wall and CPU of whole processes (spawn to exit; mqd: `mqd run --burst` + "
        "`mqd spark --once`), CPU of the process tree (Spark's JVM included), peak RSS of the tree "
        "(sampled, 0.1 s); load is the 1-minute load "
        "average before each run.",
        "",
        "| records | pipeline | records/s to a readable table | wall s | mqd / spark (paired) | CPU s per M "
        "records (+ broker) | peak RSS MB | steps: wall s; peak RSS MB | exact | load |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for size in result["sizes"]:
        s = size["summary"]
        for name in ("mqd", "spark"):
            row = s[name]
            rss = row["steps_peak_rss_mb"]
            steps = "; ".join(
                f"{k} {fmt_range(w)} s, {fmt_range(rss.get(k), 0)} MB" for k, w in row["steps_wall_s"].items()
            )
            ratio = fmt_range(s["ratio_mqd_to_spark"], 2) if name == "mqd" else "-"
            lines.append(
                f"| {size['records']:,} | {name} | {fmt_range(row['records_per_s'], thousands=True)} | "
                f"{fmt_range(row['wall_s'])} | "
                f"{ratio} | {fmt_range(row['cpu_s_per_m'], 2)} "
                f"({fmt_range(row['cpu_s_per_m_with_broker'], 2)}) | "
                f"{fmt_range(row['peak_rss_mb'], 0)} | {steps} | {row['exact']} | "
                f"{fmt_range(row['load'], 2)} |"
            )
    lat = result.get("latency") or []
    if lat:
        lines += [
            "",
            "Produce to queryable (a record's Kafka timestamp to the first delta-rs poll, every "
            f"{POLL_S * 1000:.0f} ms, that sees its commit; the commit file's time beside it):",
            "",
            "| pipeline | rate (achieved) | records seen / produced | commits | p50 ms | p99 ms | max ms | "
            "commit-file p50 / p99 ms | CPU s (+ broker) | steady CPU s per M records (+ broker) | "
            "peak RSS MB | load |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in lat:
            if "error" in r:
                lines.append(f"| {r['pipeline']} | {r['error']} |")
                continue
            lines.append(
                f"| {r['pipeline']} | {r['rate']:,}/s for {r['seconds']:.0f} s "
                f"({r['produced']['achieved_per_s']:,}) | "
                f"{r['records']:,} / {r['expected']:,} | {r['commits']} | {r.get('queryable_p50_ms', '-')} | "
                f"{r.get('queryable_p99_ms', '-')} | {r.get('queryable_max_ms', '-')} | "
                f"{r.get('commit_p50_ms', '-')} / {r.get('commit_p99_ms', '-')} | "
                f"{r['cpu_s']} ({r['broker_cpu_s']}) | {_steady(r)} | "
                f"{r['peak_rss_mb']:.0f} | {r['load']} |"
            )
        by_name = {r["pipeline"]: r for r in lat if "steady_cpu_s" in r}
        if {"mqd", "spark"} <= by_name.keys() and by_name["spark"]["steady_cpu_s"] > 0:
            ratio = by_name["mqd"]["steady_cpu_s_per_m"] / by_name["spark"]["steady_cpu_s_per_m"]
            lines += [
                "",
                f"Steady CPU per million records, mqd's pipeline (daemon and job) / Spark's Kafka source: "
                f"**{ratio:.2f}** (the CPU of each process tree from the producer's start until the "
                "table held its records; start-up and warm-ups left out).",
            ]
    lines += [
        "",
        "Spark's Kafka source tuning: session "
        + ", ".join(f"`{k}={val}`" for k, val in a["spark_tuning"].items())
        + "; source "
        + ", ".join(f"`{k}={val}`" for k, val in a["source_options"].items())
        + ".",
    ]
    if a.get("note"):
        lines += ["", a["note"]]
    return "\n".join(lines) + "\n"


def _steady(r: dict[str, Any]) -> str:
    if "steady_cpu_s_per_m" not in r:  # a result written before the steady figures
        return "-"
    m = max(1, r["produced"]["records"]) / 1e6
    return f"{r['steady_cpu_s_per_m']} ({(r['steady_cpu_s'] + r['steady_broker_cpu_s']) / m:.2f})"


def update_readme(md: str) -> None:
    replace_block(README, README_BEGIN, README_END, md)


def _kv(items: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in items)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.kafka_to_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,4000000", help="records per size (default 1M,4M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--latency-rate", type=int, default=50_000)
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--pipelines", default="mqd,spark", help="which throughput pipelines (default both)")
    ap.add_argument("--latency-pipelines", default="mqd,spark", help="which latency pipelines (default both)")
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument(
        "--spark-tuning",
        action="append",
        default=[],
        help="key=value over the bare script's session settings (default: driver memory 2g)",
    )
    ap.add_argument(
        "--source-option", action="append", default=[], help="key=value over the Kafka source's options"
    )
    ap.add_argument(
        "--mqd-option",
        action="append",
        default=[],
        help="section.key=TOML value over mqd's config (e.g. consumer.fetch_min_bytes=65536)",
    )
    ap.add_argument("--quick", action="store_true", help="100k records, 1 round, 5 s of latency")
    ap.add_argument("--note", default="", help="a sentence for the results (why this run differs)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the landings and tables")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds, args.latency_seconds = "100000", 1, 5.0
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    args.pipelines = [p for p in str(args.pipelines).split(",") if p]
    args.latency_pipelines = [p for p in str(args.latency_pipelines).split(",") if p]
    args.spark_tuning = {**SPARK_TUNING, **_kv(args.spark_tuning)}
    args.source_options = {**SPARK_SOURCE_OPTIONS, **_kv(args.source_option)}
    args.mqd_options = _kv(args.mqd_option)
    return args


# the session settings tuned for the alternative over mqd's (chosen by measuring, bench/README.md)
SPARK_TUNING = {"spark.driver.memory": "2g"}


def _versions() -> dict[str, str]:
    from mqd.testing.kafka_cluster import KAFKA_VERSION

    return {
        "kafka": KAFKA_VERSION,
        **package_versions(("pyspark", "delta-spark", "deltalake", "confluent-kafka")),
    }


def main(argv: list[str] | None = None) -> int:
    from mqd.testing.kafka_cluster import KafkaCluster

    args = parse_args(argv)
    become_subreaper()
    temp = None
    if args.workdir is None:
        temp = tempfile.mkdtemp(prefix="mqd-kafka-table-")
        args.workdir = Path(temp)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "benchmark": "kafka_to_table",
        "machine": machine_facts(),
        "versions": _versions(),
        "args": {
            "sizes": args.sizes,
            "rounds": args.rounds,
            "partitions": args.partitions,
            "latency_rate": args.latency_rate,
            "latency_seconds": args.latency_seconds,
            "spark_tuning": args.spark_tuning,
            "source_options": args.source_options,
            "mqd_options": args.mqd_options,
            "broker_jvm_flags": list(BROKER_JVM_FLAGS),
            "note": args.note,
        },
        "sizes": [],
        "latency": [],
    }
    stem = "kafka_to_table-quick" if args.quick else "kafka_to_table"
    kafka = KafkaCluster(
        args.workdir / "kafka",
        1,
        settings={"group.initial.rebalance.delay.ms": "0"},
        jvm_flags=BROKER_JVM_FLAGS,
    )
    try:
        kafka.start()
        bench = Bench(args, kafka)
        if not args.no_throughput:
            for records in args.sizes:
                result["sizes"].append(bench.throughput(records))
                write_json(args.out / f"{stem}.json", result)
        if not args.no_latency:
            for pipeline in args.latency_pipelines:
                try:
                    result["latency"].append(bench.latency(pipeline))
                except (RuntimeError, TimeoutError) as exc:
                    result["latency"].append({"pipeline": pipeline, "error": str(exc)})
                    log(f"  latency {pipeline}: {exc}")
                write_json(args.out / f"{stem}.json", result)
    finally:
        kafka.stop()
        if temp is not None and not args.keep:
            shutil.rmtree(temp, ignore_errors=True)
    write_json(args.out / f"{stem}.json", result)
    md = render_md(result)
    (args.out / f"{stem}.md").write_text(md)
    if not args.quick and not args.no_readme and args.out == RESULTS:
        update_readme(md)
    print(md)
    exact = all(r.get("exact") for s in result["sizes"] for r in s["runs"])
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
