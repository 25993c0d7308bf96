"""``python -m bench.hosts_scale``: three daemons over 1,000 partitions on the many-hosts rig (issue 33).

As root (``mqd.testing.hosts.HostRig``: three Apache Kafka brokers, SeaweedFS and three ``mqd run``
daemons, each on a network host of its own). Per group protocol, a topic of ``--partitions`` (1,000)
partitions, replicated 3 times, gets ``--records`` records of 1 KiB per partition with a skew (the
partition p's count is ``records * (1 + p % 4) / 2``, so partitions differ in bytes as real ones do);
then three daemons start in one group:

- **classic, sticky**: ``consumer.allocation = "sticky"`` (mqd's strategy, run by the group's leader);
- **KIP-848**: ``consumer.kafka.group_protocol = "consumer"`` (the broker's assignor).

Measured: the partitions and the bytes (the produced bytes of its partitions) each daemon owns once
the group is stable; the seconds from the daemons' start until the landing holds everything; a
member change (d2 stopped with SIGTERM, later started again): seconds until the group is stable
without it, and with it again (the coordinator's view, ``DescribeConsumerGroups`` every 0.2 s);
idle, the fetch requests per broker per second of the three daemons together (their
``mqd_fetch_requests`` counters over ``--idle-seconds``) and the heartbeats (one per member per
``heartbeat_interval``, from the config). Prints a JSON line per protocol; ``--md`` the table of
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from mqd.testing.hosts import HostRig
from mqd.waiting import wait_until_sync

KIB = 1024
HEARTBEAT_S = 0.5  # HostRig's daemons' consumer.heartbeat_interval
ADMIN_PORT = 9480


def wait_group(rig: HostRig, members: set[str], timeout: float = 300.0) -> float:
    started = time.monotonic()

    def settled() -> bool:
        a = rig.assignment()
        owned = set().union(*a.values()) if a else set()
        return set(a) == members and owned == set(range(rig.partitions))

    wait_until_sync(settled, timeout, f"the group to be {sorted(members)}", interval=0.2)
    return time.monotonic() - started


def produce(rig: HostRig, records: int) -> dict[int, int]:
    """The skewed load; bytes per partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": rig.bootstrap, "acks": "all", "linger.ms": 50})
    sizes: dict[int, int] = {}
    value = os.urandom(KIB)
    for p in range(rig.partitions):
        n = records * (1 + p % 4) // 2
        for _ in range(n):
            while True:
                try:
                    producer.produce(rig.topic, value=value, partition=p)
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
        sizes[p] = n * KIB
    assert producer.flush(120) == 0
    return sizes


def fetch_requests(rig: HostRig) -> dict[str, float]:
    """Broker node -> fetch requests the daemons sent it so far (their /metrics)."""
    out: dict[str, float] = {}
    for i in range(len(rig.daemons)):
        url = f"http://{rig.host(f'd{i}').address}:{ADMIN_PORT}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
        for m in re.finditer(r'^mqd_fetch_requests_total\{node="([^"]+)"\} ([0-9.e+]+)$', text, re.M):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def measure(
    rig: HostRig, name: str, settings: dict[str, dict[str, Any]], records: int, idle_s: float
) -> dict[str, Any]:
    settings = {**settings, "admin": {"enabled": True, "host": "0.0.0.0", "port": ADMIN_PORT}}
    rig.use_stream(name, rig.partitions, settings)
    sizes = produce(rig, records)
    ends = {p: n // KIB for p, n in sizes.items()}
    started = time.monotonic()
    rig.start_daemons()
    first_stable = wait_group(rig, {"d0", "d1", "d2"})
    rig.wait_landed(ends, 600)
    landed_s = time.monotonic() - started
    owned = rig.assignment()
    balance = {
        c: {"partitions": len(ps), "mib": round(sum(sizes[p] for p in ps) / KIB / KIB, 1)}
        for c, ps in sorted(owned.items())
    }
    before = fetch_requests(rig)
    t0 = time.monotonic()
    time.sleep(idle_s)  # the idle window measured: nothing to wait for, the counters run
    after = fetch_requests(rig)
    window = time.monotonic() - t0
    per_broker = {node: round((after.get(node, 0) - n) / window, 1) for node, n in sorted(before.items())}
    rig.daemons[2].stop(signal.SIGTERM, 60)
    without = wait_group(rig, {"d0", "d1"})
    rig.daemons[2].start()
    rig.wait_daemon_started(2)
    back = wait_group(rig, {"d0", "d1", "d2"})
    for i in range(3):
        rig.stop_daemon(i)
    assert rig.kafka is not None
    rig.kafka.delete_topic(name, timeout=120)
    return {
        "protocol": name,
        "partitions": rig.partitions,
        "records": sum(ends.values()),
        "mib": round(sum(sizes.values()) / KIB / KIB, 1),
        "first_stable_s": round(first_stable, 1),
        "landed_s": round(landed_s, 1),
        "balance": balance,
        "idle_fetch_requests_per_broker_s": per_broker,
        "heartbeats_per_s": round(3 / HEARTBEAT_S, 1),
        "member_left_s": round(without, 1),
        "member_back_s": round(back, 1),
    }


def render_md(results: list[dict[str, Any]]) -> str:
    head = (
        "| group | partitions per daemon | MiB per daemon | stable after start | all landed "
        "| d2 stopped: stable without it | d2 back: stable with it | idle fetches per broker per s |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        b = r["balance"]
        fetches = ", ".join(f"{k}: {v}" for k, v in r["idle_fetch_requests_per_broker_s"].items())
        lines.append(
            f"| {r['protocol']} | {' / '.join(str(v['partitions']) for v in b.values())} "
            f"| {' / '.join(str(v['mib']) for v in b.values())} | {r['first_stable_s']} s "
            f"| {r['landed_s']} s | {r['member_left_s']} s | {r['member_back_s']} s | {fetches} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hosts_scale", description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--records", type=int, default=4)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--md", action="store_true", help="print the bench/README.md table too")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="mqd-hosts-scale-") as tmp:
        rig = HostRig(Path(tmp), partitions=args.partitions, group_protocol="consumer", kafka_heap="1g")
        with rig:
            assert rig.kafka is not None
            rig.kafka.delete_topic(rig.topic, timeout=120)  # the rig's first stream: not measured
            runs = [
                # the rig runs KIP-848 by default here: the classic run says so itself
                (
                    "sticky",
                    {"consumer": {"allocation": "sticky"}, "consumer.kafka": {"group_protocol": "classic"}},
                ),
                ("kip848", {"consumer.kafka": {"group_protocol": "consumer"}}),
            ]
            for name, settings in runs:
                r = measure(rig, name, settings, args.records, args.idle_seconds)
                print(json.dumps(r), flush=True)
                results.append(r)
    if args.md:
        print(render_md(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
