"""Micro-benchmark behind the Kafka source's protocol-layer choice (not a test): what aiokafka's own
Fetch response struct costs to parse, next to decoding the records it carries.

    .venv/bin/python -m bench.kafka_protocol
"""

from __future__ import annotations

import time

from aiokafka.protocol.fetch import FetchResponse_v11

from bench.kafka_decode import answer
from mqd.sources.kafka.record_batch import decode_partition
from mqd.topic_partition import TopicPartition


def main() -> None:
    data = answer(1, 9000)  # ~1 MiB of 100-byte records per partition
    parts: list[tuple[object, ...]] = [(p, 0, 9000, 9000, 0, [], -1, data) for p in range(12)]
    wire = FetchResponse_v11(0, 0, 0, [("bench", parts)]).encode()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 2.0:
        FetchResponse_v11.decode(wire)
        n += 1
    parse = (time.perf_counter() - t0) / n
    resp = FetchResponse_v11.decode(wire)
    t0 = time.perf_counter()
    rows = 0
    for _topic, ps in resp.topics:
        for p in ps:
            d = decode_partition(p[-1], 0, True, tp=TopicPartition("bench", p[0]))
            rows += sum(b.records.num_rows for b in d.batches)
    decode = time.perf_counter() - t0
    mib = len(wire) / 2**20
    print(f"Fetch answer of {mib:.1f} MiB, 12 partitions, {rows:,} records:")
    print(f"  aiokafka struct parse: {parse * 1000:.2f} ms ({mib / parse:,.0f} MiB/s)")
    print(f"  mqd records decode:    {decode * 1000:.2f} ms ({rows / decode / 1e6:.1f}M records/s)")


if __name__ == "__main__":
    main()
