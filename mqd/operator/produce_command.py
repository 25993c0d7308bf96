"""The body of ``mqd produce``: synthetic records to one topic, with retries per partition, a progress
line and a summary.

A partition whose master is down must not abort the others (in a RocketMQ-style cluster it stays
unwritable until its master is back): each batch gets ``retries`` more attempts with backoff
(mqd/backoff.py) on a retriable error; a partition that still fails is *given up*, and its later
batches are counted as failed without being sent, so the run goes on at full speed on the other
partitions. Only one batch per partition retries at a time, so a down master costs the run one retry
window, not one per batch in flight. Every record is counted once, as acked or failed; failures
exit 1 with one line per failed partition.

On a terminal, stderr shows a progress line (sent, acked, failed, records/s) rewritten about once a
second; elsewhere (a pipe, a log, CI) only the summary is written.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa

from mqd.backoff import Backoff
from mqd.topic_name import topic_name_problem
from mqd.wire import format as fmt
from mqd.wire.client import BrokerError
from mqd.wire.producer import _ACKS, Producer, TokenBucket, _worth_retrying, key_partition, synthetic_values

__all__ = ["PartitionTally", "ProduceRun", "produce_cli"]

EXIT_OK = 0
EXIT_FAILED = 1  # a broker failure, or records that were not acknowledged
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

PROGRESS_INTERVAL = 1.0
# one attempt: the Producer's own retries (new route, 421/429/503) for this long
ATTEMPT_TIMEOUT = 2.0
RETRY_BACKOFF_BASE = 0.5
RETRY_BACKOFF_CAP = 4.0
INFLIGHT = 8


@dataclass(slots=True)
class PartitionTally:
    """What became of one partition's records."""

    acked: int = 0
    failed: int = 0
    retries: int = 0  # attempts after the first, over all batches
    given_up: bool = False
    error: str | None = None  # the error that gave the partition up
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # one batch retries at a time


@dataclass
class ProduceRun:
    """Counters of one ``mqd produce`` run, updated as answers arrive; the progress line and the
    summary read them."""

    topic: str
    count: int
    size: int
    partitions: dict[int, PartitionTally] = field(default_factory=dict)
    sent: int = 0  # records handed to a send (acked + failed + in flight)
    started: float = field(default_factory=time.perf_counter)
    elapsed: float = 0.0

    def tally(self, partition: int) -> PartitionTally:
        t = self.partitions.get(partition)
        if t is None:
            t = self.partitions[partition] = PartitionTally()
        return t

    @property
    def acked(self) -> int:
        return sum(t.acked for t in self.partitions.values())

    @property
    def failed(self) -> int:
        return sum(t.failed for t in self.partitions.values())

    def failed_partitions(self) -> list[int]:
        return sorted(p for p, t in self.partitions.items() if t.failed)

    def progress_line(self, rate: float) -> str:
        return (
            f"{self.topic}: sent {self.sent:,}/{self.count:,}, acked {self.acked:,}, "
            f"failed {self.failed:,}, {rate:,.0f} records/s, {time.perf_counter() - self.started:.0f}s"
        )

    def summary(self) -> str:
        """One line: acked of requested, value bytes, elapsed, rate (of acknowledged records)."""
        acked, seconds = self.acked, self.elapsed
        mb = acked * self.size / 1e6
        rps = acked / seconds if seconds > 0 else 0.0
        of = f" of {self.count}" if acked != self.count else ""
        return (
            f"produced {acked}{of} records ({mb:.1f} MB of values) to {self.topic} in {seconds:.2f}s: "
            f"{rps:,.0f} records/s, {mb / seconds if seconds > 0 else 0:.1f} MB/s; "
            f"acked {acked}, failed {self.failed}"
        )

    def failure_lines(self) -> list[str]:
        """One line per partition with failed records: counts, retries and the error."""
        lines = []
        for p in self.failed_partitions():
            t = self.partitions[p]
            name = f"{self.topic}/{p}"
            error = (t.error or "").removeprefix(f"{name}: ")
            lines.append(
                f"  {name}: acked {t.acked}, failed {t.failed} (given up after {t.retries} retries): {error}"
            )
        return lines


class _Progress:
    """The progress line on a terminal: rewritten in place about once a second, erased at the end."""

    def __init__(self, run: ProduceRun, stream: IO[str]) -> None:
        self._run = run
        self._stream = stream
        self._task: asyncio.Task[None] | None = None
        self._shown = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        last_acked, last_t = 0, time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL)  # a refresh period, not a wait for a condition
            now, acked = time.perf_counter(), self._run.acked
            rate = (acked - last_acked) / (now - last_t) if now > last_t else 0.0
            last_acked, last_t = acked, now
            self._stream.write("\r\x1b[K" + self._run.progress_line(rate))
            self._stream.flush()
            self._shown = True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False


async def _send_with_retries(
    producer: Producer,
    run: ProduceRun,
    partition: int,
    values: pa.Array,
    keys: pa.Array | None,
    retries: int,
) -> None:
    """Send one batch; count its records as acked or failed, never both, never neither."""
    n = len(values)
    tally = run.tally(partition)
    if tally.given_up:
        tally.failed += n
        return
    try:
        await producer.send_batch(run.topic, partition, values, keys=keys)
        tally.acked += n
        return
    except BrokerError as exc:
        first: BrokerError = exc
    async with tally.lock:  # the other batches of this partition wait for this one's verdict
        if tally.given_up:
            tally.failed += n
            return
        error = first
        backoff = Backoff(RETRY_BACKOFF_BASE, RETRY_BACKOFF_CAP)
        attempts_left = retries if _worth_retrying(first) else 0
        while attempts_left > 0:
            attempts_left -= 1
            tally.retries += 1
            await asyncio.sleep(backoff.next())  # the backoff between attempts
            try:
                await producer.send_batch(run.topic, partition, values, keys=keys)
                tally.acked += n
                return
            except BrokerError as exc:
                error = exc
                if not _worth_retrying(exc):  # e.g. 504 with acks=all: written, a retry would duplicate
                    break
        tally.failed += n
        tally.given_up = True
        tally.error = str(error)


async def _produce(
    run: ProduceRun,
    bootstrap: str,
    rate: float,
    keys: int,
    batch: int,
    acks: str,
    token: str | None,
    retries: int,
    progress: IO[str] | None,
) -> None:
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    bucket = TokenBucket(rate, burst=max(float(batch), rate / 10)) if rate > 0 else None
    sem = asyncio.Semaphore(INFLIGHT)
    async with Producer(bootstrap, acks=acks, token=token, retry_timeout=ATTEMPT_TIMEOUT) as producer:
        n = producer.partitions_for(run.topic)
        for p in range(n):
            run.tally(p)
        key_names = [f"key-{i}".encode() for i in range(keys)]
        key_arr = pa.array(key_names, type=pa.binary()) if keys > 0 else None
        key_parts = np.array([key_partition(k, n) for k in key_names], dtype=np.int64)
        tasks: set[asyncio.Task[None]] = set()
        shown = _Progress(run, progress) if progress is not None else None

        async def one(partition: int, values: pa.Array, k: pa.Array | None) -> None:
            try:
                await _send_with_retries(producer, run, partition, values, k, retries)
            finally:
                sem.release()

        run.started = time.perf_counter()
        if shown is not None:
            shown.start()
        try:
            rr = 0
            pos = 0
            while pos < run.count:
                m = min(batch, run.count - pos)
                values = synthetic_values(m, run.size, rng)
                if bucket is not None:
                    await bucket.acquire(m)
                groups: list[tuple[int, pa.Array, pa.Array | None]]
                if key_arr is None:
                    groups = [(rr % n, values, None)]
                    rr += 1
                else:
                    key_ids = np.arange(pos, pos + m, dtype=np.int64) % keys
                    parts = key_parts[key_ids]
                    groups = []
                    for p in np.unique(parts):
                        idx = np.flatnonzero(parts == p)
                        groups.append(
                            (int(p), values.take(pa.array(idx)), key_arr.take(pa.array(key_ids[idx])))
                        )
                for p, v, k in groups:
                    await sem.acquire()
                    run.sent += len(v)
                    t = asyncio.create_task(one(p, v, k))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                pos += m
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            run.elapsed = time.perf_counter() - run.started
            if shown is not None:
                await shown.stop()


def _usage_problems(
    topic: str, count: int, size: int, rate: float, keys: int, batch: int, acks: str, retries: int
) -> list[str]:
    problems = []
    if count < 0:
        problems.append("--count must be >= 0")
    if size < 0:
        problems.append("--size must be >= 0")
    if rate < 0:
        problems.append("--rate must be >= 0")
    if keys < 0:
        problems.append("--keys must be >= 0")
    if batch < 1:
        problems.append("--batch must be >= 1")
    if retries < 0:
        problems.append("--retries must be >= 0")
    if acks not in _ACKS:
        problems.append(f"--acks must be one of {_ACKS}")
    topic_problem = topic_name_problem(topic)
    if topic_problem is not None:  # a usage error (exit 2), found before connecting
        problems.append(f"--topic: {topic_problem}")
    return problems


def produce_cli(
    bootstrap: str,
    topic: str,
    count: int,
    size: int,
    rate: float,
    keys: int,
    batch: int,
    acks: str,
    token: str | None,
    retries: int = 3,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    progress: bool | None = None,
) -> int:
    """``mqd produce``: returns the exit code (0 every record acked, 1 a broker failure or failed
    records, 2 bad arguments, 130 interrupted). ``progress``: the progress line on ``err``
    (default: when ``err`` is a terminal)."""
    out = out or sys.stdout
    err = err or sys.stderr
    problems = _usage_problems(topic, count, size, rate, keys, batch, acks, retries)
    if problems:
        for p in problems:
            print(f"error: {p}", file=err)
        return EXIT_USAGE
    if progress is None:
        progress = _isatty(err)
    run = ProduceRun(topic=topic, count=count, size=size)
    try:
        asyncio.run(
            _produce(run, bootstrap, rate, keys, batch, acks, token, retries, err if progress else None)
        )
    except (BrokerError, fmt.BatchError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        if run.sent:
            print(run.summary(), file=out)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"interrupted; {run.summary()} ({run.sent - run.acked - run.failed} in flight)", file=err)
        return EXIT_INTERRUPTED
    print(run.summary(), file=out)
    failed = run.failed_partitions()
    if failed:
        print(
            f"error: {run.failed} records not acknowledged on {len(failed)} of {len(run.partitions)} "
            f"partitions of {topic}:",
            file=err,
        )
        for line in run.failure_lines():
            print(line, file=err)
        return EXIT_FAILED
    return EXIT_OK


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
