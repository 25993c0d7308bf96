"""Micro-benchmark of the Kafka source's RecordBatch v2 decoder (not a test): records/s of 100-byte
values into Arrow, CRC-32C checked, with the compiled kernel and with the pure fallback.

    .venv/bin/python -m bench.kafka_decode
"""

from __future__ import annotations

import struct
import time

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.record_batch import decode_partition
from mqd.topic_partition import TopicPartition


def answer(batches: int, per_batch: int, codec: int = 0) -> bytes:
    """One partition's fetch data: ``batches`` batches of ``per_batch`` records (8-byte keys)."""
    out = []
    for b in range(batches):
        builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 2**30)
        for i in range(per_batch):
            builder.append(i, 1_700_000_000_000 + i, b"k%07d" % i, b"v" * 100, [])
        buf = builder.build()
        struct.pack_into(">q", buf, 0, b * per_batch)
        out.append(bytes(buf))
    return b"".join(out)


def rate(data: bytes, compiled: bool, seconds: float) -> float:
    tp = TopicPartition("bench", 0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        d = decode_partition(data, 0, True, tp=tp, compiled=compiled)
        n += sum(b.records.num_rows for b in d.batches)
    return n / (time.perf_counter() - t0)


def main() -> None:
    for label, batches, per in (
        ("1 MiB answer, 16 KiB batches", 64, 140),
        ("8 MiB answer, 1 MiB batches", 8, 9000),
    ):
        data = answer(batches, per)
        c = rate(data, True, 2.0) if records_kernel.COMPILED else float("nan")
        py = rate(answer(2, per), False, 2.0)
        print(f"{label}: compiled {c / 1e6:.2f}M records/s, pure fallback {py / 1e6:.3f}M records/s")
    for codec, name in ((2, "snappy"), (3, "lz4"), (4, "zstd"), (1, "gzip")):
        c = rate(answer(8, 9000, codec), True, 1.0) if records_kernel.COMPILED else float("nan")
        print(f"{name}, 1 MiB batches: compiled {c / 1e6:.2f}M records/s")


if __name__ == "__main__":
    main()
