"""RSS of a broker node before, during and after rounds of many concurrent long polls.

A measurement, not a test (no bound is asserted; tests/integration/broker/test_memory_returned.py
asserts a bound at a smaller scale): one single-node cluster, then ``--rounds`` rounds of
``--polls`` fetches held at once (one connection each, at the log end, ``--wait-ms``) that end by
their max wait. The node's VmRSS is read from /proc before the first round, while all the fetches
are held, and after each round once the node has given memory back (every pass of its "memory
given back" log line) and ``--settle`` seconds passed. Memory the node keeps after the polls end
shows as ``after`` growing over ``before``.

The held sample is taken only once the node reports every fetch held (``long_polls_held`` in
/v1/stats): opening thousands of connections on a loaded machine can take longer than a fetch is
held, and a sample taken by the clock alone would then see a fraction of them.

    python -m bench.longpoll_rss --polls 5000 --rounds 3
    python -m bench.longpoll_rss --env MALLOC_ARENA_MAX=2 --env PYTHONMALLOC=malloc
    python -m bench.longpoll_rss --tree /tmp/mqd-main --no-cap   # another checkout (keys it knows)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from mqd.memory_trim import TRIM_PASSES
from mqd.testing import LocalCluster

TRIM_LINE = "memory given back after a burst"  # mqd.memory_trim's log line


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _held(session: aiohttp.ClientSession, url: str, wait_ms: int) -> int:
    body = {"partitions": [{"topic": "events", "partition": 0, "offset": 0}], "max_wait_ms": wait_ms}
    async with session.post(url + "/v1/fetch", json=body) as resp:
        await resp.read()
        return resp.status


async def _stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/v1/stats") as resp:
        body: dict[str, Any] = await resp.json()
        return body


async def _until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout}s")
        await asyncio.sleep(0.1)


async def _round(cluster: LocalCluster, pid: int, args: argparse.Namespace, polls: int) -> dict[str, Any]:
    url = cluster.url(cluster.master())
    trims_before = cluster.log(cluster.master()).count(TRIM_LINE)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=args.wait_ms / 1000 + 120)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as probe,
    ):
        started = time.monotonic()
        tasks = [asyncio.create_task(_held(session, url, args.wait_ms)) for _ in range(polls)]

        async def all_held() -> bool:
            return int((await _stats(probe, url))["long_polls_held"]) >= polls

        await _until(all_held, args.wait_ms / 1000, f"{polls} fetches held")
        all_held_s = time.monotonic() - started
        held_rss = 0.0
        for _ in range(5):
            held_rss = max(held_rss, rss_mib(pid))
            await asyncio.sleep(0.1)
        statuses = await asyncio.gather(*tasks)

    async def trimmed() -> bool:
        return cluster.log(cluster.master()).count(TRIM_LINE) >= trims_before + TRIM_PASSES

    await _until(trimmed, 60, "the node's trims after the burst")
    await asyncio.sleep(args.settle)
    counts: dict[str, int] = {}
    for s in statuses:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return {
        "all_held_after_s": round(all_held_s, 1),
        "held_rss_mib": round(held_rss, 1),
        "after_mib": round(rss_mib(pid), 1),
        "statuses": counts,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    env = dict(e.split("=", 1) for e in args.env)
    if args.tree:
        env["PYTHONPATH"] = args.tree
    settings: dict[str, Any] = {"limits": {"max_wait_ms": args.wait_ms}}
    if not args.no_cap:
        settings["limits"]["max_long_polls"] = args.polls
    with tempfile.TemporaryDirectory(prefix="longpoll-rss-") as d:
        cluster = LocalCluster(Path(d), topics={"events": 1}, node_settings=settings, env=env)
        with cluster:
            node = cluster.nodes[cluster.master()]
            assert node.pid is not None
            await asyncio.sleep(args.settle)
            if args.warmup:
                # a first burst the size of the trim threshold: what the first requests create
                # once (lazy imports, caches) is not memory the load keeps
                await _round(cluster, node.pid, args, args.warmup)
            out: dict[str, Any] = {
                "polls": args.polls,
                "env": env,
                "before_mib": round(rss_mib(node.pid), 1),
                "rounds": [],
            }
            for _ in range(args.rounds):
                out["rounds"].append(await _round(cluster, node.pid, args, args.polls))
            return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--polls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--wait-ms", type=int, default=30000, help="held this long: all must be open at once")
    p.add_argument("--warmup", type=int, default=0, help="polls of a first round before 'before'")
    p.add_argument("--settle", type=float, default=3.0, help="seconds before each RSS reading after a round")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the node's environment")
    p.add_argument("--tree", help="run the node from this mqd checkout (PYTHONPATH)")
    p.add_argument("--no-cap", action="store_true", help="do not set limits.max_long_polls (older trees)")
    args = p.parse_args()
    if args.tree:
        args.tree = os.path.abspath(args.tree)
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
