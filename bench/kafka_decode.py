"""Micro-benchmark of the Kafka source's RecordBatch v2 decoder (not a test): records per second of
100-byte values (8-byte keys, no headers) into Arrow, CRC-32C checked, with the compiled kernel and
with the pure fallback, and per codec.

Issue 14's target is per core, so the rate is records per CPU second of the decoding thread
(``time.thread_time``, the best of ``--repeat`` timings: what other work on a shared machine takes
away is not the decoder's cost); the wall-clock rate and the load average are printed beside it.

    .venv/bin/python -m bench.kafka_decode
"""

from __future__ import annotations

import argparse
import os
import struct
import time

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mqd.sources.kafka import records_kernel
from mqd.sources.kafka.record_batch import decode_partition
from mqd.topic_partition import TopicPartition

CODECS = ((1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd"))


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


def rate(data: bytes, compiled: bool, seconds: float, repeat: int) -> tuple[float, float]:
    """(records per CPU second, records per wall second), each the best of ``repeat`` timings of
    about ``seconds`` / ``repeat``."""
    tp = TopicPartition("bench", 0)
    per_call = sum(
        b.records.num_rows for b in decode_partition(data, 0, True, tp=tp, compiled=compiled).batches
    )
    best_cpu = best_wall = 0.0
    for _ in range(repeat):
        n, c0, w0 = 0, time.thread_time(), time.perf_counter()
        while time.perf_counter() - w0 < seconds / repeat:
            decode_partition(data, 0, True, tp=tp, compiled=compiled)
            n += per_call
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        best_cpu = max(best_cpu, n / max(cpu, 1e-9))
        best_wall = max(best_wall, n / wall)
    return best_cpu, best_wall


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="per figure")
    ap.add_argument("--repeat", type=int, default=5, help="timings per figure (the best counts)")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}; compiled kernel: {records_kernel.COMPILED}")
    shapes = (
        ("1 MiB answer, 16 KiB batches (140 records)", 64, 140),
        ("8 MiB answer, 1 MiB batches (9,000 records)", 8, 9000),
    )
    for label, batches, per in shapes:
        data = answer(batches, per)
        for compiled in (True, False):
            if compiled and not records_kernel.COMPILED:
                continue
            # the fallback is ~100x slower: a smaller answer keeps a timing short
            cpu, wall = rate(data if compiled else answer(2, per), compiled, args.seconds, args.repeat)
            kind = "compiled" if compiled else "pure fallback"
            print(
                f"{label}, {kind}: {cpu / 1e6:.2f}M records per CPU second "
                f"({wall / 1e6:.2f}M per wall second)"
            )
    if records_kernel.COMPILED:
        for codec, name in CODECS:
            cpu, wall = rate(answer(8, 9000, codec), True, args.seconds, args.repeat)
            print(
                f"{name}, 1 MiB batches, compiled: {cpu / 1e6:.2f}M records per CPU second "
                f"({wall / 1e6:.2f}M wall)"
            )


if __name__ == "__main__":
    main()
