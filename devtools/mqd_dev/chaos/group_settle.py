"""How long a Kafka consumer group takes to settle after a daemon restart during a network hang
(issue 14, the open finding of chaos seed 543094): ``python -m mqd_dev.chaos.group_settle``.

The chaos run's Kafka set-up (kafka_source.KafkaChaosRun: Tansu behind the fault proxy, two
daemons in one group, the producer) and then, ``--trials`` times, that round's two faults at
once: every answer through the proxy held (``net_hang``) while one daemon is stopped with SIGTERM
and started again (``daemon_restart``). A trial has settled when both daemons' last "consumer
group joined" is of one generation and neither logged anything of the group since for ``--quiet``
seconds; it prints the seconds from the end of the hang to that join, and the rejoins in between.
``--storage-delay`` puts Tansu's S3 storage behind a proxy of its own that delays every answer (a
loaded machine); ``RUST_LOG=warn,tansu_broker::coordinator=debug`` shows Tansu's side in
``tansu.log`` of the work directory, which is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from mqd import log as mqdlog
from mqd.testing.cluster import free_port
from mqd_dev.chaos.kafka_source import KafkaChaosRun, TansuBroker
from mqd_dev.chaos.procs import DaemonProc
from mqd_dev.chaos.proxy import FaultProxy, Faults
from mqd_dev.chaos.runner import KAFKA_KINDS, ChaosOptions, stop_clean

_JOINED = "consumer group joined"
_REJOIN = "consumer group: rejoining"


def group_events(d: DaemonProc, since: float) -> list[tuple[float, str, int | None]]:
    """(unix time, event, generation) of the daemon's group events logged after ``since``."""
    out: list[tuple[float, str, int | None]] = []
    try:
        lines = d.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if _JOINED not in line and _REJOIN not in line:
            continue
        try:
            ev = json.loads(line)
            ts = datetime.fromisoformat(ev["timestamp"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if ts >= since:
            out.append((ts, ev["event"], ev.get("generation")))
    return out


def settled_at(daemons: list[DaemonProc], since: float, quiet: float, now: float) -> float | None:
    """When the group settled: every daemon's last group event after ``since`` is a join of one
    generation, the later of them at least ``quiet`` seconds ago; None if not (yet)."""
    last = []
    for d in daemons:
        evs = group_events(d, since)
        if not evs or evs[-1][1] != _JOINED:
            return None
        last.append(evs[-1])
    if len({gen for _ts, _e, gen in last}) != 1:
        return None
    at = max(ts for ts, _e, _g in last)
    return at if now - at >= quiet else None


async def trial(run: KafkaChaosRun, n: int, hold: float, quiet: float, limit: float) -> dict[str, Any]:
    target = run.daemons[n % len(run.daemons)]
    start = time.time()
    run.broker.set_faults(Faults(blackhole=True))

    async def unhang() -> float:
        await asyncio.sleep(hold)
        run.broker.clear_faults()
        return time.time()

    async def restart() -> None:
        await stop_clean(target, run.failures)
        target.start()

    hang_end, _ = await asyncio.gather(unhang(), restart())
    deadline = hang_end + limit
    at = None
    while time.time() < deadline:
        await asyncio.sleep(0.5)
        at = settled_at(run.daemons, start, quiet, time.time())
        if at is not None:
            break
    rejoins = sum(1 for d in run.daemons for _ts, e, _g in group_events(d, start) if e == _REJOIN)
    joins = sum(1 for d in run.daemons for _ts, e, _g in group_events(d, start) if e == _JOINED)
    return {
        "trial": n,
        "restarted": target.name,
        "settle_s": None if at is None else round(at - hang_end, 2),
        "rejoins": rejoins,
        "joins": joins,
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="mqd-group-settle-"))
    opts = ChaosOptions(
        root=root,
        rounds=0,
        seed=args.seed,
        kinds=KAFKA_KINDS,
        source="kafka",
        kafka_storage=args.kafka_storage,
        spark=False,
    )
    run = KafkaChaosRun(opts)
    print(f"group_settle: work dir {root}", flush=True)
    # Tansu's S3 storage behind a proxy of its own: --storage-delay makes every storage answer slow
    storage = FaultProxy(0, free_port())
    await storage.start()
    store = run.broker.store if isinstance(run.broker, TansuBroker) else None
    if store is not None:
        seaweed_start = store.start

        def start_behind_proxy() -> None:
            seaweed_start()
            storage.target_port = int(store.endpoint.rsplit(":", 1)[1])
            store.endpoints[0] = f"http://127.0.0.1:{storage.listen_port}"

        store.start = start_behind_proxy  # type: ignore[method-assign]
    results = []
    try:
        await run._setup()
        if args.storage_delay:
            storage.faults = Faults(delay=1.0, delay_s=args.storage_delay)
        for n in range(args.trials):
            res = await trial(run, n, args.hold, args.quiet, args.limit)
            print(json.dumps(res), flush=True)
            results.append(res)
    finally:
        if run._supervisor is not None:
            run._supervisor.cancel()
        await run.load.stop(timeout=5.0)
        run.ledger.close()
        for d in [*run.daemons, run.extra]:
            await d.stop_async(signal.SIGKILL)
        await run.broker.stop()
        await storage.stop()
    return results


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m mqd_dev.chaos.group_settle", description=__doc__)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--hold", type=float, default=4.83, help="the hang, seconds (seed 543094: 4.83)")
    p.add_argument("--quiet", type=float, default=6.0)
    p.add_argument("--limit", type=float, default=90.0, help="give a trial up after this long")
    p.add_argument("--seed", type=int, default=543094)
    p.add_argument("--kafka-storage", choices=("s3", "memory"), default="s3")
    p.add_argument(
        "--storage-delay",
        type=float,
        default=0.0,
        help="mean delay of every answer of Tansu's S3 storage, seconds (a loaded machine)",
    )
    args = p.parse_args()
    mqdlog.configure("warning", "json")
    results = asyncio.run(main_async(args))
    settles = [r["settle_s"] for r in results if r["settle_s"] is not None]
    unsettled = len(results) - len(settles)
    if settles:
        print(
            f"settled {len(settles)}/{len(results)}: median {statistics.median(settles):.1f} s "
            f"[{min(settles):.1f}-{max(settles):.1f}]; not within {args.limit:.0f} s: {unsettled}"
        )
    else:
        print(f"none of {len(results)} settled within {args.limit:.0f} s")


if __name__ == "__main__":
    main()
