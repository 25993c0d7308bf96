"""The alternative pipelines' consumer process: a Kafka client (confluent-kafka or aiokafka) that
writes the same Parquet micro-batches as mqd's landing, run as a process of its own so that every
pipeline is timed alike, from spawn to exit (``bench/alt_kafka.py`` starts it)::

    python -m bench.alt_consumer --client confluent-kafka --bootstrap 127.0.0.1:9092 --topic events \
        --records 6000000 --partitions 12 --out /tmp/landing --result /tmp/result.json

It imports only what such a consumer needs (the client, numpy, pyarrow and mqd's layout functions
for identical files), assigns every partition from offset 0 (no group join: mqd's burst run does
not pay for one either) and exits once it has written every record. The result file holds its
own view: records, files and the steady rate from consumer creation to the last file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqd.fsutil import fsync_dir
from mqd.landing.layout import FileRange, file_name, landing_table, write_parquet
from mqd.records import HEADERS_TYPE, RECORD_SCHEMA


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class MicroBatchWriter:
    """Per-partition buffers cut into files by record count, bytes or age (like mqd's sink), written
    on ``workers`` threads (mqd's sink has two) with mqd's own layout functions: same schema, same
    file metadata, same compression, and the same publication (temp file, fsync, exclusive link,
    fsync of the folder).
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
        workers: int = 2,
        max_pending: int = 3,
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
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="alt-writer")
        self._lock = threading.Lock()  # the counters, from the writer threads
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

    def flush_partition(self, partition: int) -> None:
        """Cut ``partition``'s buffer now (without waiting for the writes)."""
        if partition in self._buf:
            self._cut(partition)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _cut(self, partition: int) -> None:
        batches = self._buf.pop(partition)
        del self._rows[partition], self._bytes[partition], self._since[partition]
        table = pa.Table.from_batches(batches, schema=RECORD_SCHEMA)
        # backpressure: at most max_pending files queued behind the writer threads
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
            ts_min=int(pc.min(ts).as_py()),
            ts_max=int(pc.max(ts).as_py()),
        )
        final = self.root / rng.path
        tmp = self.root / f".{rng.path}.tmp"
        write_parquet(tmp, landing_table(self.topic, partition, records), rng, self.compression)
        os.link(tmp, final)  # exclusive: fails if the name exists
        os.unlink(tmp)
        fsync_dir(self.root)
        with self._lock:
            self.files += 1
            self.records += records.num_rows
            if self.first_file_at is None:
                self.first_file_at = time.time()  # wall clock: the parent compares it with the spawn
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


def _result(name: str, size: int, writer: MicroBatchWriter, t0: float, cpu0: float) -> dict[str, Any]:
    seconds = time.perf_counter() - t0
    return {
        "name": name,
        "records": writer.records,
        "files": writer.files,
        "seconds": round(seconds, 3),
        "records_per_s": round(writer.records / seconds),
        "mb_per_s": round(writer.records * size / 1e6 / seconds, 1),
        "ready_at": time.time() - seconds,  # wall clock at consumer creation
        "cpu_s": round(self_cpu_seconds() - cpu0, 2),
        "first_file_at": writer.first_file_at,
    }


async def _consume_aiokafka(
    bootstrap: str, topic: str, records: int, partitions: int, writer: MicroBatchWriter, timeout: float
) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # large fetches: one request brings a partition's 8 MiB, the whole answer up to 64 MiB
        fetch_max_bytes=64 * 2**20,
        max_partition_fetch_bytes=8 * 2**20,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    # Parquet work on one thread of its own (the writer is not thread-safe; FIFO keeps the order),
    # overlapped with fetching: the loop waits only when a second write would queue behind the first
    writes = ThreadPoolExecutor(1, thread_name_prefix="bench-aiokafka-parquet")
    pending: list[asyncio.Future[None]] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got = 0
        deadline = time.monotonic() + timeout
        loop = asyncio.get_running_loop()

        def write(fetched: list[tuple[int, pa.RecordBatch]]) -> None:
            for partition, batch in fetched:
                writer.add(partition, batch)
            writer.tick()

        while got < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"aiokafka consumer: {got}/{records} records after {timeout}s")
            fetched = await consumer.getmany(timeout_ms=200, max_records=50_000)
            out: list[tuple[int, pa.RecordBatch]] = []
            for tp, msgs in fetched.items():
                if not msgs:
                    continue
                out.append(
                    (
                        tp.partition,
                        record_batch(
                            np.fromiter((m.offset for m in msgs), dtype=np.int64, count=len(msgs)),
                            np.fromiter((m.timestamp for m in msgs), dtype=np.int64, count=len(msgs)),
                            [m.key for m in msgs],
                            [m.value for m in msgs],
                        ),
                    )
                )
                got += len(msgs)
            while pending and (len(pending) > 1 or pending[0].done()):
                await pending.pop(0)  # also raises a failed write here
            pending.append(loop.run_in_executor(writes, write, out))
        for fut in pending:
            await fut
        await loop.run_in_executor(writes, writer.flush)
    finally:
        writes.shutdown(wait=True)
        await consumer.stop()


def consume_aiokafka(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    size: int,
    out: Path,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    writer = MicroBatchWriter(
        out, topic, max_records=max_records, max_bytes=max_bytes, max_age=max_age, compression=compression
    )
    cpu0 = self_cpu_seconds()
    t0 = time.perf_counter()
    try:
        asyncio.run(_consume_aiokafka(bootstrap, topic, records, partitions, writer, timeout))
        return _result("aiokafka", size, writer, t0, cpu0)
    finally:
        writer.close()


def consume_confluent(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int,
    size: int,
    out: Path,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    shutil.rmtree(out, ignore_errors=True)
    writer = MicroBatchWriter(
        out, topic, max_records=max_records, max_bytes=max_bytes, max_age=max_age, compression=compression
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-confluent",
            "enable.auto.commit": False,
            # librdkafka waits fetch.queue.backoff.ms (default 1000) once its local queue is past
            # its thresholds, which stalls a fast drain for a second at a time: 1 ms here
            "fetch.queue.backoff.ms": 1,
            # large fetches, and a local queue that holds several of them
            "fetch.max.bytes": 64 * 2**20,
            "max.partition.fetch.bytes": 8 * 2**20,
            "queued.max.messages.kbytes": 256 * 1024,
            "fetch.wait.max.ms": 100,
        }
    )
    cpu0 = self_cpu_seconds()
    t0 = time.perf_counter()
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got = 0
        deadline = time.monotonic() + timeout
        while got < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"confluent consumer: {got}/{records} records after {timeout}s")
            msgs = consumer.consume(50_000, 0.2)
            by_part: dict[int, list[Any]] = {}
            for m in msgs:
                if m.error() is not None:
                    raise RuntimeError(f"confluent consumer: {m.error()}")
                by_part.setdefault(int(m.partition() or 0), []).append(m)
            for p, ms in by_part.items():
                writer.add(
                    p,
                    record_batch(
                        np.fromiter((m.offset() for m in ms), dtype=np.int64, count=len(ms)),
                        np.fromiter((m.timestamp()[1] for m in ms), dtype=np.int64, count=len(ms)),
                        [m.key() for m in ms],
                        [m.value() for m in ms],
                    ),
                )
                got += len(ms)
            writer.tick()
        writer.flush()
        return _result("confluent-kafka", size, writer, t0, cpu0)
    finally:
        consumer.close()
        writer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--client", required=True, choices=["confluent-kafka", "aiokafka"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--size", type=int, default=100, help="value size (for MB/s only)")
    ap.add_argument("--out", type=Path, required=True, help="landing folder")
    ap.add_argument("--result", type=Path, required=True, help="JSON result file")
    ap.add_argument("--max-records", type=int, default=500_000)
    ap.add_argument("--max-bytes", type=int, default=32 * 2**20)
    ap.add_argument("--max-age", type=float, default=5.0)
    ap.add_argument("--compression", default="snappy")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    fn = consume_confluent if args.client == "confluent-kafka" else consume_aiokafka
    res = fn(
        args.bootstrap,
        args.topic,
        args.records,
        args.partitions,
        args.size,
        args.out,
        max_records=args.max_records,
        max_bytes=args.max_bytes,
        max_age=args.max_age,
        compression=args.compression,
        timeout=args.timeout,
    )
    tmp = args.result.with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, args.result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
