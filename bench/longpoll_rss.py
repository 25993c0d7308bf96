"""RSS of a broker node before, during and after rounds of many concurrent long polls.

A measurement, not a test (no bound is asserted): one single-node cluster, then ``--rounds``
rounds of ``--polls`` fetches held at once (one connection each, at the log end, ``--wait-ms``)
that end by their max wait; the node's VmRSS is read from /proc before the first round, while the
fetches are held, and ``--settle`` seconds after each round ended. Memory the node keeps after the
polls end shows as ``after`` growing over ``before``.

    python -m bench.longpoll_rss --polls 2000 --rounds 3
    python -m bench.longpoll_rss --tree /tmp/mqd-main --no-cap   # another checkout (keys it knows)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from mqd.testing import LocalCluster


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _held(session: aiohttp.ClientSession, url: str, offset: int, wait_ms: int) -> int:
    body = {"partitions": [{"topic": "events", "partition": 0, "offset": offset}], "max_wait_ms": wait_ms}
    async with session.post(url + "/v1/fetch", json=body) as resp:
        await resp.read()
        return resp.status


async def _round(url: str, pid: int, polls: int, wait_ms: int) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=wait_ms / 1000 + 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(_held(session, url, 0, wait_ms)) for _ in range(polls)]
        held_rss = 0.0
        deadline = time.monotonic() + wait_ms / 1000
        while time.monotonic() < deadline - 0.5:  # RSS peak while they are held
            held_rss = max(held_rss, rss_mib(pid))
            await asyncio.sleep(0.2)
        statuses = await asyncio.gather(*tasks)
    counts: dict[str, int] = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return {"held_rss_mib": round(held_rss, 1), "statuses": counts}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    env = {"PYTHONPATH": args.tree} if args.tree else {}
    settings: dict[str, Any] = {"limits": {"max_wait_ms": args.wait_ms}}
    if not args.no_cap:
        settings["limits"]["max_long_polls"] = args.polls
    with tempfile.TemporaryDirectory(prefix="longpoll-rss-") as d:
        cluster = LocalCluster(Path(d), topics={"events": 1}, node_settings=settings, env=env)
        with cluster:
            node = cluster.nodes[cluster.master()]
            assert node.pid is not None
            url = cluster.url(cluster.master())
            await asyncio.sleep(args.settle)
            out: dict[str, Any] = {
                "polls": args.polls,
                "before_mib": round(rss_mib(node.pid), 1),
                "rounds": [],
            }
            for _ in range(args.rounds):
                r = await _round(url, node.pid, args.polls, args.wait_ms)
                await asyncio.sleep(args.settle)
                r["after_mib"] = round(rss_mib(node.pid), 1)
                out["rounds"].append(r)
            return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--polls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wait-ms", type=int, default=5000)
    p.add_argument("--settle", type=float, default=3.0, help="seconds before each RSS reading after a round")
    p.add_argument("--tree", help="run the node from this mqd checkout (PYTHONPATH)")
    p.add_argument("--no-cap", action="store_true", help="do not set limits.max_long_polls (older trees)")
    args = p.parse_args()
    if args.tree:
        args.tree = os.path.abspath(args.tree)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
