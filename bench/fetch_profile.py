"""Broker fetch hot path: cost of answering 12 partitions x 1 MiB in one fetch.

Starts one broker node (subprocess, 127.0.0.1 ephemeral port), fills ``--partitions`` partitions
with ``--fill-mib`` MiB each (batches of ``--batch`` records of ``--size`` bytes), then sends
``--rounds`` fetches, each asking every partition for ``--answer-mib`` MiB at the offset the previous
answer ended (wrapping to 0 at the log end). Reports the broker's CPU time per fetch (what the
hot path costs the node, read from /proc) and the client-side throughput.

``--py-spy FILE`` also samples the broker with py-spy (``pip install py-spy``) and prints the
functions with the most self samples (FILE keeps the collapsed stacks).

    .venv/bin/python bench/fetch_profile.py --rounds 300
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from mqd import format as fmt  # noqa: E402
from mqd.client import BrokerClient  # noqa: E402
from mqd.localcluster import LocalCluster  # noqa: E402

TOPIC = "events"
MiB = 1024 * 1024


async def fill(client: BrokerClient, url: str, partitions: int, fill_mib: int, batch: int, size: int) -> None:
    body = fmt.encode_batch([bytes([i % 251]) * size for i in range(batch)])
    per_request = max(1, (4 * MiB) // len(body))
    payload = body * per_request
    rounds = max(1, fill_mib * MiB // len(payload))

    async def one(p: int) -> None:
        for _ in range(rounds):
            await client.produce(url, TOPIC, p, payload)

    await asyncio.gather(*(one(p) for p in range(partitions)))


async def run_fetches(
    client: BrokerClient, url: str, partitions: int, answer_mib: int, rounds: int
) -> dict[str, Any]:
    offsets = [0] * partitions
    got = 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        answer = await client.fetch(
            url,
            [
                {"topic": TOPIC, "partition": p, "offset": o, "max_bytes": answer_mib * MiB}
                for p, o in enumerate(offsets)
            ],
            client_id="profile",
            max_wait_ms=0,
            max_bytes=partitions * answer_mib * MiB,
        )
        for pf in answer.partitions:
            got += len(pf.data)
            offsets[pf.partition] = 0 if pf.next_offset >= pf.max_offset else pf.next_offset
    seconds = time.perf_counter() - t0
    return {"rounds": rounds, "bytes": got, "seconds": seconds}


def top_self(collapsed: Path, n: int = 15) -> list[tuple[str, int]]:
    counts: collections.Counter[str] = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack:
            counts[stack.split(";")[-1]] += int(samples)
    return counts.most_common(n)


async def main_async(args: argparse.Namespace, cluster: LocalCluster) -> dict[str, Any]:
    url = cluster.url(cluster.master())
    node = cluster.nodes[cluster.master()]
    assert node.proc is not None
    proc = psutil.Process(node.proc.pid)
    async with BrokerClient(request_timeout=60) as client:
        await fill(client, url, args.partitions, args.fill_mib, args.batch, args.size)
        await run_fetches(client, url, args.partitions, args.answer_mib, 20)  # warm up
        spy = None
        if args.py_spy:
            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = await asyncio.create_subprocess_exec(
                exe,
                "record",
                "--format",
                "raw",
                "--rate",
                "500",
                "--nonblocking",
                "-o",
                str(args.py_spy),
                "--pid",
                str(proc.pid),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            await asyncio.sleep(1.0)  # let it attach
        cpu0 = proc.cpu_times()
        result = await run_fetches(client, url, args.partitions, args.answer_mib, args.rounds)
        cpu1 = proc.cpu_times()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            _, err = await asyncio.wait_for(spy.communicate(), 30)
            if spy.returncode not in (0, -2):
                print(f"py-spy failed: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
    broker_cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "partitions": args.partitions,
        "answer_mib": args.answer_mib,
        "rounds": result["rounds"],
        "fetch_mib": round(result["bytes"] / result["rounds"] / MiB, 2),
        "client_fetches_per_s": round(result["rounds"] / result["seconds"], 1),
        "client_mib_per_s": round(result["bytes"] / MiB / result["seconds"], 1),
        "broker_cpu_ms_per_fetch": round(broker_cpu * 1000 / result["rounds"], 2),
        "broker_user_ms_per_fetch": round((cpu1.user - cpu0.user) * 1000 / result["rounds"], 2),
        "broker_sys_ms_per_fetch": round((cpu1.system - cpu0.system) * 1000 / result["rounds"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--answer-mib", type=int, default=1)
    ap.add_argument("--fill-mib", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="records per batch")
    ap.add_argument("--size", type=int, default=1024, help="value bytes per record")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--py-spy", type=Path, default=None, help="collapsed-stack output file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mqd-fetch-profile-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            topics={TOPIC: args.partitions},
            node_settings={"log_level": "warning", "storage": {"fsync": "never"}},
        )
        with cluster:
            out = asyncio.run(main_async(args, cluster))
    print(json.dumps(out, indent=2))
    if args.py_spy and args.py_spy.exists():
        print("\nbroker functions with the most self samples:")
        for frame, samples in top_self(args.py_spy):
            print(f"{samples:8d}  {frame}")


if __name__ == "__main__":
    main()
