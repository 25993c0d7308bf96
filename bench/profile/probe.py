"""Run the daemon (or its consumer alone) in this process with probes around it.

Started by ``run.py`` as the subprocess it measures (optionally under py-spy). Two modes:

``daemon``   the real ``mqd.daemon.Daemon`` in burst mode on uvloop, as ``mqd run --burst`` runs
             it, plus a sampler task on the same loop that writes, every ``--sample-ms``, what holds
             memory: RSS, pyarrow's pool, the consumer's buffered and reserved bytes, the sink's
             pending bytes; and timers around the sink's worker (encode, fsync, publish) and the
             loop's own iterations. Probes only wrap functions (no mqd code is edited).
``consumer`` the Consumer alone: fetch + decode to Arrow, drained and thrown away (no sink), until
             ``--expect`` records were drained: what the fetch side can do without the sink.

Output: one JSON object per line on ``--out`` (samples, then a final summary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import uvloop  # noqa: E402

from mqd import log as mqdlog  # noqa: E402
from mqd.config import load_daemon_config  # noqa: E402


class Timers:
    """Wall time and calls per named probe; thread-safe (the sink's worker thread records too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)

        setattr(owner, attr, timed)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {k: {"s": round(v, 3), "calls": self.calls[k]} for k, v in sorted(self.seconds.items())}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds per thread of this process (from /proc), named by Python's thread names, to see
    whether a second core is used."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tdir in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            comm = (tdir / "comm").read_text().strip()
            name = names.get(int(tdir.name), comm)
            fields = (tdir / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick
        out[name] = round(out.get(name, 0.0) + cpu, 2)
    return out


def enable_isal_crc() -> None:
    """Prototype: the same CRC-32 (IEEE, zlib's) from ISA-L, ~7x faster (pip install isal)."""
    from isal import isal_zlib

    from mqd import format as fmt

    class _Zlib:
        crc32 = staticmethod(isal_zlib.crc32)

    fmt.zlib = _Zlib  # type: ignore[assignment]


def enable_pipeline(daemon: Any, workers: int, max_inflight: int) -> dict[str, int]:
    """Prototype of a pipelined working loop (measurement only, not production code):

    * the loop no longer awaits a flush: each due partition is flushed by its own task, at most one
      per partition (files stay in offset order) and ``max_inflight`` in all, so the loop keeps
      draining (and the fetchers keep fetching) while files are encoded;
    * the sink's worker pool has ``workers`` threads (Parquet encoding and fsync release the GIL).
    """
    from concurrent.futures import ThreadPoolExecutor

    sink = daemon.sink
    sink._executor.shutdown(wait=False)
    sink._executor = ThreadPoolExecutor(workers, thread_name_prefix="mqd-landing")
    inflight: set[asyncio.Task[None]] = set()
    busy: set[Any] = set()
    counters = {"flush_tasks": 0, "max_inflight": 0, "waits": 0}
    real_publish = daemon._publish
    real_publish_due = daemon._publish_due
    real_burst_done = daemon._burst_done
    ready = daemon.consumer._state.data_ready

    async def one(tp: Any) -> None:
        try:
            await real_publish([tp])
        finally:
            busy.discard(tp)
            ready.set()  # wake the working loop: a flush ended (burst end, next due partition)

    async def publish_due() -> None:
        if daemon._landing_error is not None:
            await real_publish_due()
            return
        if daemon.burst and sink.pending_records and daemon.consumer.caught_up():
            due = list(sink._buffers)
        else:
            due = sink.due(time.monotonic())
        started = 0
        for tp in due:
            if tp in busy:
                continue
            started += 1
            while len(inflight) >= max_inflight:
                counters["waits"] += 1
                await asyncio.wait(set(inflight), return_when=asyncio.FIRST_COMPLETED)
            busy.add(tp)
            task = asyncio.create_task(one(tp))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            counters["flush_tasks"] += 1
            counters["max_inflight"] = max(counters["max_inflight"], len(inflight))
        if due and not started and inflight:
            # everything due is being flushed already: yield (the working loop only waits when
            # nothing is due, so returning at once would spin and starve the flushes)
            await asyncio.wait(set(inflight), timeout=0.05, return_when=asyncio.FIRST_COMPLETED)

    daemon._publish_due = publish_due
    daemon._burst_done = lambda: not inflight and real_burst_done()
    return counters


class AnswerTracker:
    """Fetch answer bodies still alive: a body lives as long as any Arrow buffer sliced from it
    (the consumer's queue, the sink's buffers, a file being encoded) holds its memoryview."""

    def __init__(self) -> None:
        import weakref

        from mqd import client

        self._weakref = weakref
        self._bodies: list[tuple[int, list[Any]]] = []
        self.answers = 0
        self.bytes = 0
        real = client.decode_fetch_answer

        def decode(body: bytes) -> Any:
            ans = real(body)
            refs = [weakref.ref(pf.data) for pf in ans.partitions if len(pf.data)]
            if refs:
                self._bodies.append((len(body), refs))
            self.answers += 1
            self.bytes += len(body)
            return ans

        client.decode_fetch_answer = decode  # type: ignore[assignment]

    def alive(self) -> tuple[int, int]:
        """(bodies, bytes) still referenced; forgets the dead ones."""
        live = [(n, refs) for n, refs in self._bodies if any(r() is not None for r in refs)]
        self._bodies = live
        return len(live), sum(n for n, _ in live)


async def run_daemon(
    cfg_path: Path,
    out: Any,
    sample_s: float,
    *,
    burst: bool = True,
    stop_file: Path | None = None,
    proto: dict[str, str] | None = None,
) -> dict[str, Any]:
    from mqd.daemon import Daemon
    from mqd.landing import layout, publisher

    timers = Timers()
    # the worker thread's parts: parquet encode+fsync, the conditional publication around it
    timers.wrap(layout, "write_parquet", "worker.write_parquet(encode+fsync)")
    timers.wrap(publisher.Publisher, "publish_records", "worker.publish_records(total)")
    timers.wrap(layout, "fsync_dir", "worker.fsync_dir")
    timers.wrap(layout, "append_line", "worker.append_line(manifest+fsync)")
    timers.wrap(layout, "write_atomic", "worker.write_atomic(state+fsync)")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        t0 = time.perf_counter()
        try:
            real_fsync(fd)
        finally:
            timers.add("os.fsync(all)", time.perf_counter() - t0)

    os.fsync = fsync  # type: ignore[assignment]

    config = load_daemon_config(cfg_path)
    mqdlog.configure("warning", "json")
    answers = AnswerTracker()
    daemon = Daemon(config, burst=burst)
    flushes: list[dict[str, Any]] = []
    real_flush = daemon.sink.flush

    async def flush(tps: Any = None) -> Any:
        # one loop-side flush: how many partitions, how old their buffers were, how long it held
        # the working loop (nothing is drained meanwhile)
        now = time.monotonic()
        bufs = daemon.sink._buffers
        chosen = list(bufs) if tps is None else [tp for tp in tps if tp in bufs]
        ages = [now - bufs[tp].since for tp in chosen]
        # how old the oldest record (produce timestamp) is when its flush starts
        wall_ms = time.time() * 1000
        rec_ages = [
            (wall_ms - bufs[tp].batches[0].column(1)[0].value) / 1000 for tp in chosen if bufs[tp].batches
        ]
        t0 = time.perf_counter()
        res = await real_flush(tps)
        flushes.append(
            {
                "t": round(t0 - t_start, 3),
                "partitions": len(chosen),
                "records": sum(r.count for fr in res for r in fr.published),
                "oldest_age_s": round(max(ages), 3) if ages else None,
                "youngest_age_s": round(min(ages), 3) if ages else None,
                "oldest_record_age_s": round(max(rec_ages), 3) if rec_ages else None,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
        return res

    daemon.sink.flush = flush  # type: ignore[method-assign]
    proto = proto or {}
    proto_counters: dict[str, int] = {}
    if "isal" in proto:
        enable_isal_crc()
    if "pipeline" in proto:
        proto_counters = enable_pipeline(daemon, int(proto.get("workers", 2)), int(proto.get("inflight", 4)))
    fetch_requests: dict[str, int] = {}
    # the loop side of the daemon's work
    timers.wrap(daemon, "_drain", "loop.drain+sink.add")
    timers.wrap(daemon.sink, "due", "loop.sink.due")
    state = daemon.consumer._state  # the consumer's buffers (profile tool: private access is fine)
    proc = psutil.Process()
    peak: dict[str, float] = {}
    thread_cpu: dict[str, float] = {}  # kept while threads live: the worker exits with the sink
    t_start = time.perf_counter()
    stop = asyncio.Event()

    def sample() -> dict[str, Any]:
        pool = pa.default_memory_pool()
        s = {
            "t": round(time.perf_counter() - t_start, 3),
            "rss_mb": round(proc.memory_info().rss / 2**20, 1),
            "arrow_pool_mb": round(pa.total_allocated_bytes() / 2**20, 1),
            "arrow_pool_peak_mb": round(pool.max_memory() / 2**20, 1),
            "consumer_buffered_mb": round(state.budget.buffered / 2**20, 1),
            "consumer_reserved_mb": round(state.budget.reserved / 2**20, 1),
            "consumer_buffered_records": state.buffered_records,
            "sink_pending_mb": round(daemon.sink.pending_bytes / 2**20, 1),
            "sink_pending_records": daemon.sink.pending_records,
            "published": daemon.sink.stats["records"],
        }
        n_alive, b_alive = answers.alive()
        s["answer_bodies_alive"] = n_alive
        s["answer_bodies_alive_mb"] = round(b_alive / 2**20, 1)
        for n in daemon.consumer.snapshot().nodes:
            fetch_requests[n.node_id] = n.requests
        for name, cpu in _thread_cpu().items():
            thread_cpu[name] = max(thread_cpu.get(name, 0.0), cpu)
        for k, v in s.items():
            if isinstance(v, float | int) and k != "t":
                peak[k] = max(peak.get(k, 0), v)
        return s

    async def sampler() -> None:
        while not stop.is_set():
            out.write(json.dumps({"sample": sample()}) + "\n")
            try:
                await asyncio.wait_for(stop.wait(), sample_s)
            except TimeoutError:
                pass

    # loop lag: how late a 10 ms timer fires says how long the loop is held by one callback
    lags: list[float] = []

    async def lag_probe() -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            t0 = loop.time()
            await asyncio.sleep(0.01)
            lags.append(loop.time() - t0 - 0.01)

    tasks = [asyncio.create_task(sampler()), asyncio.create_task(lag_probe())]
    await daemon.start()
    t_running = time.perf_counter()

    async def stop_requested() -> None:
        while stop_file is not None and not os.path.exists(stop_file):
            await asyncio.sleep(0.05)

    await daemon.run(None if burst else stop_requested())
    t_end = time.perf_counter()
    stop.set()
    await asyncio.gather(*tasks)
    lags.sort()
    records = daemon.stats["records_published"]
    seconds = t_end - t_running
    return {
        "mode": "daemon",
        "records": records,
        "files": daemon.stats["files_published"],
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds) if seconds else None,
        "startup_s": round(t_running - t_start, 3),
        "peak": peak,
        "timers": timers.snapshot(),
        "thread_cpu_s": thread_cpu,
        "fetch_requests": fetch_requests,
        "flushes": flushes,
        "proto": proto,
        "fetch_answers": answers.answers,
        "fetch_answer_mb_mean": round(answers.bytes / max(1, answers.answers) / 2**20, 2),
        "proto_counters": proto_counters,
        "loop_lag_ms": {
            "p50": round(lags[len(lags) // 2] * 1000, 1) if lags else None,
            "p99": round(lags[int(len(lags) * 0.99)] * 1000, 1) if lags else None,
            "max": round(lags[-1] * 1000, 1) if lags else None,
        },
    }


async def run_consumer(cfg_path: Path, out: Any, expect: int, timeout: float) -> dict[str, Any]:
    from mqd.client import BrokerClient
    from mqd.consumer import Consumer

    config = load_daemon_config(cfg_path)
    mqdlog.configure("warning", "json")
    client = BrokerClient(request_timeout=config.consumer.request_timeout)
    await client.start()
    consumer = Consumer(config.consumer, client=client)
    proc = psutil.Process()
    await consumer.start()
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    records = batches = 0
    peak_rss = 0.0
    try:
        while records < expect and time.monotonic() < deadline:
            await consumer.wait_for_data(0.5)
            for b in consumer.fetched_batches():
                records += b.records.num_rows
                batches += 1
            peak_rss = max(peak_rss, proc.memory_info().rss / 2**20)
        seconds = time.perf_counter() - t0
        fetch = {n.node_id: n.requests for n in consumer.snapshot().nodes}
    finally:
        await consumer.stop()
        await client.close()
    return {
        "mode": "consumer",
        "records": records,
        "batches": batches,
        "seconds": round(seconds, 3),
        "records_per_s": round(records / seconds) if seconds else None,
        "peak_rss_mb": round(peak_rss, 1),
        "fetch_requests": fetch,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["daemon", "consumer", "live"])
    ap.add_argument("--proto", default="", help="prototypes: pipeline,isal,workers=2,inflight=4")
    ap.add_argument("--stop-file", type=Path, default=None, help="live mode: stop once this file exists")
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sample-ms", type=float, default=50.0)
    ap.add_argument("--expect", type=int, default=0, help="consumer mode: records to drain")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    items = filter(None, args.proto.replace("+", ",").split(","))
    proto = dict([*kv.split("=", 1), ""][:2] for kv in items)
    cpu0 = time.process_time()
    with args.out.open("w") as out, asyncio.Runner(loop_factory=uvloop.new_event_loop) as aio:
        if args.mode == "daemon":
            summary = aio.run(run_daemon(args.config, out, args.sample_ms / 1000, proto=proto))
        elif args.mode == "live":
            summary = aio.run(
                run_daemon(
                    args.config,
                    out,
                    args.sample_ms / 1000,
                    burst=False,
                    stop_file=args.stop_file,
                    proto=proto,
                )
            )
        else:
            summary = aio.run(run_consumer(args.config, out, args.expect, args.timeout))
        summary["cpu_s"] = round(time.process_time() - cpu0, 2)
        summary.setdefault("thread_cpu_s", _thread_cpu())
        summary["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        out.write(json.dumps({"summary": summary}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
