"""One broker node on its own: produce and fetch throughput.

Starts a single-node cluster (one group, no slave) as a subprocess on an ephemeral 127.0.0.1 port.

- produce: ``--producers`` concurrent producers, each sending batches of ``--batch`` records of
  ``--size``-byte values (one batch per request, encoded before the clock starts, so the broker
  and the HTTP path are measured, not the encoder).
- fetch: one client reads every partition from offset 0, one request for all partitions per round,
  counting records from the batch headers (what the broker serves, not what a consumer does next).

Prints the figures and writes bench/results/broker.json.

    python -m bench.broker_bench --records 1000000
    python -m bench.broker_bench --allocators --rounds 3   # the node's default allocator (its
        # re-exec with PYTHONMALLOC=malloc, mqd/memory_trim.py) against PYTHONMALLOC=pymalloc,
        # interleaved, each run on a fresh node: medians and paired ratios
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import MB, RESULTS, Workload, machine_facts, rates, timed_workers, write_json
from mqd.testing import LocalCluster
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.producer import Producer

TOPIC = "events"


async def bench_produce(url: str, work: Workload, producers: int) -> dict[str, Any]:
    encoded = [(p, fmt.encode_batch(values)) for p, values in work.chunks()]
    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
    for item in encoded:
        queue.put_nowait(item)
    async with Producer(url) as producer:

        async def worker() -> None:
            while True:
                try:
                    p, body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await producer.send_encoded(TOPIC, p, body)

        seconds = await timed_workers(worker, producers)
    return {
        "records": work.records,
        "producers": producers,
        "batch": work.batch,
        "requests": len(encoded),
        **rates(work.records, work.nbytes, seconds),
    }


async def bench_fetch(
    url: str, work: Workload, *, max_bytes: int, partition_max_bytes: int, timeout: float = 300.0
) -> dict[str, Any]:
    positions = dict.fromkeys(range(work.partitions), 0)
    ends = {p: n for p, n in enumerate(work.per_partition())}
    records = wire = requests = 0
    async with BrokerClient(request_timeout=60) as client:
        t0 = time.perf_counter()
        while any(positions[p] < ends[p] for p in positions):
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"fetch bench: {records}/{work.records} records after {timeout}s")
            answer = await client.fetch(
                url,
                [
                    {"topic": TOPIC, "partition": p, "offset": o, "max_bytes": partition_max_bytes}
                    for p, o in positions.items()
                    if o < ends[p]
                ],
                client_id="broker-bench",
                max_wait_ms=0,
                max_bytes=max_bytes,
            )
            requests += 1
            for part in answer.partitions:
                if part.error:
                    raise RuntimeError(f"fetch {part.topic}/{part.partition}: {part.error}")
                wire += len(part.data)
                for info in fmt.scan(part.data, crc=False):
                    records += info.next_offset - max(info.base_offset, positions[part.partition])
                positions[part.partition] = part.next_offset
        seconds = time.perf_counter() - t0
    return {
        "records": records,
        "requests": requests,
        "records_per_request": round(records / max(requests, 1)),
        **rates(records, work.nbytes, seconds),
        "wire_mb_per_s": round(wire / MB / seconds, 1),
    }


def run(
    records: int,
    size: int,
    partitions: int,
    batch: int,
    producers: int,
    out: Path | None,
    fsync: str = "interval",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    work = Workload(records, size, partitions, batch)
    with tempfile.TemporaryDirectory(prefix="mqd-broker-bench-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            topics={TOPIC: partitions},
            groups=1,
            node_settings={"log_level": "warning", "storage": {"fsync": fsync}},
            env=env,
        )
        with cluster:
            url = cluster.bootstrap
            produce = asyncio.run(bench_produce(url, work, producers))
            print(
                f"produce: {produce['records_per_s']:,} records/s, {produce['mb_per_s']} MB/s "
                f"({producers} producers, batches of {batch})"
            )
            fetch = asyncio.run(bench_fetch(url, work, max_bytes=32 * 2**20, partition_max_bytes=4 * 2**20))
            print(
                f"fetch:   {fetch['records_per_s']:,} records/s, {fetch['mb_per_s']} MB/s "
                f"({fetch['requests']} requests, {fetch['records_per_request']:,} records per request)"
            )
            stats = cluster.get_json(cluster.node_ids[0], "/v1/stats") or {}
    result = {
        "benchmark": "broker",
        "config": {
            "records": records,
            "value_size": size,
            "partitions": partitions,
            "batch": batch,
            "producers": producers,
            "fsync": fsync,
        },
        "machine": machine_facts(),
        "produce": produce,
        "fetch": fetch,
        "broker_stats": stats,
    }
    if out is not None:
        write_json(out, result)
        print(f"wrote {out}")
    return result


ALLOCATORS = {"default (malloc re-exec)": None, "pymalloc": {"PYTHONMALLOC": "pymalloc"}}


def compare_allocators(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds over the allocators, each run a fresh node: produce and fetch records/s, medians
    [min-max] and the per-round ratio of each to the default."""
    import os
    import statistics

    runs: list[dict[str, Any]] = []
    names = list(ALLOCATORS)
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotated: neither always runs first
            load = round(os.getloadavg()[0], 2)
            res = run(
                args.records,
                args.size,
                args.partitions,
                args.batch,
                args.producers,
                None,
                args.fsync,
                env=ALLOCATORS[name],
            )
            runs.append(
                {
                    "allocator": name,
                    "round": r,
                    "load": load,
                    "produce_records_per_s": res["produce"]["records_per_s"],
                    "fetch_records_per_s": res["fetch"]["records_per_s"],
                }
            )
            print(runs[-1], flush=True)
    summary: dict[str, Any] = {}
    base = {x["round"]: x for x in runs if x["allocator"] == names[0]}
    for name in names:
        rows = [x for x in runs if x["allocator"] == name]
        summary[name] = {}
        for key in ("produce_records_per_s", "fetch_records_per_s"):
            v = [x[key] for x in rows]
            ratio = [x[key] / base[x["round"]][key] for x in rows]
            summary[name][key] = {"median": statistics.median(v), "min": min(v), "max": max(v)}
            summary[name][key.replace("records_per_s", "ratio_to_default")] = {
                "median": round(statistics.median(ratio), 3),
                "min": round(min(ratio), 3),
                "max": round(max(ratio), 3),
            }
    result = {"benchmark": "broker-allocators", "machine": machine_facts(), "runs": runs, "summary": summary}
    write_json(args.out.with_name("broker-allocators.json"), result)
    for name, v in summary.items():
        p, f = v["produce_records_per_s"], v["fetch_records_per_s"]
        print(
            f"{name}: produce {p['median']:,.0f} [{p['min']:,}-{p['max']:,}] "
            f"(x{v['produce_ratio_to_default']['median']}), fetch {f['median']:,.0f} "
            f"[{f['min']:,}-{f['max']:,}] (x{v['fetch_ratio_to_default']['median']})"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100, help="value size in bytes")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1000, help="records per produced batch")
    ap.add_argument("--producers", type=int, default=4, help="concurrent producers")
    ap.add_argument("--fsync", choices=["always", "interval", "never"], default="interval")
    ap.add_argument("--out", type=Path, default=RESULTS / "broker.json")
    ap.add_argument("--allocators", action="store_true", help="compare the node's allocators (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --allocators")
    args = ap.parse_args(argv)
    if min(args.records, args.partitions, args.batch, args.producers) < 1 or args.size < 0:
        ap.error("--records, --partitions, --batch and --producers must be >= 1, --size >= 0")
    if args.allocators:
        compare_allocators(args)
        return 0
    run(args.records, args.size, args.partitions, args.batch, args.producers, args.out, args.fsync)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
