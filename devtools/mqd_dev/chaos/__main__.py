"""``python -m mqd_dev.chaos``: a seeded fault-injection run against real processes (``make chaos``).

Exits 0 when every invariant held, 1 when one did not, 2 on bad arguments. As root it re-executes
itself under ``unshare -m`` so the landing tmpfs and read-only bind mounts (mqd_dev.chaos.disk) live in a
private mount namespace that the kernel removes with the run, however the run ends.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mqd import log as mqdlog
from mqd_dev.chaos.runner import (
    APACHE_KAFKA_KINDS,
    CATEGORIES,
    KAFKA_KINDS,
    ChaosOptions,
    expand_kinds,
    format_summary,
    run_chaos,
)

_NS_ENV = "MQD_CHAOS_MOUNT_NS"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mqd_dev.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    p.add_argument("--root", type=Path, default=None, help="work directory (default: a new temp dir)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the summary JSON here (default: $TMPDIR/mqd-chaos-<seed>.json)",
    )
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--slaves", type=int, default=1)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--daemons", type=int, default=2)
    p.add_argument("--faults-per-round", type=int, default=2)
    p.add_argument("--hold-min", type=float, default=2.0)
    p.add_argument("--hold-max", type=float, default=5.0)
    p.add_argument("--round-timeout", type=float, default=60.0)
    p.add_argument("--run-timeout", type=float, default=1800.0)
    p.add_argument("--batch-records", type=int, default=20)
    p.add_argument("--produce-interval", type=float, default=0.1)
    p.add_argument(
        "--kinds",
        default="all",
        help="comma-separated fault kinds or groups to draw from: kind names, categories "
        f"({', '.join(CATEGORIES)}), classic, safety, all (default); with --source kafka: "
        f"{', '.join(APACHE_KAFKA_KINDS)}, their categories (daemon, broker, network), all; with "
        f"--source tansu: {', '.join(KAFKA_KINDS)}, their categories, all",
    )
    p.add_argument(
        "--landing",
        choices=("local", "s3"),
        default="local",
        help="local: a directory (a tmpfs as root); s3: s3:// on a SeaweedFS the run starts on 127.0.0.1",
    )
    p.add_argument(
        "--landing-table",
        choices=("none", "delta"),
        default="delta",
        help="the daemons' landing.table: delta (default) commits what they publish to a Delta table "
        "at the landing's root, which the end check reads with delta-rs, DuckDB and Polars against the "
        "landing and the ledger; none: files only",
    )
    p.add_argument(
        "--source",
        choices=("mqd", "kafka", "tansu"),
        default="mqd",
        help="mqd: mqd brokers; kafka: three Apache Kafka brokers (KRaft, a controller node of its "
        "own; the topic replicated 3 times, min.insync.replicas 2, acks=all), every client through "
        "a fault proxy per broker; tansu: one Tansu broker (Kafka protocol, the issue 14 run); both "
        "read with consumer.source = kafka",
    )
    p.add_argument(
        "--kafka-storage",
        choices=("s3", "memory"),
        default="s3",
        help="--source tansu: Tansu's storage, s3 (a SeaweedFS the run starts; a restart keeps the "
        "data) or memory (a restart loses it)",
    )
    p.add_argument(
        "--group-protocol",
        choices=("classic", "consumer"),
        default="classic",
        help="--source kafka: the daemons' consumer group protocol, classic (mqd's allocation run by "
        "the group's leader) or consumer (KIP-848: consumer.kafka.group_protocol set to consumer, the "
        "broker's assignor; the brokers' group session lowered so a killed or frozen daemon's "
        "partitions move within seconds)",
    )
    p.add_argument(
        "--topology",
        choices=("local", "hosts"),
        default="local",
        help="local: every process on this machine's network; hosts: the many-hosts rig (root: Kafka, "
        "S3, daemons and Spark each on a network namespace of its own, faulted by host; "
        "mqd_dev/chaos/hosts_topology.py; --kinds from its kinds, --rounds, --hold-*, --no-spark apply)",
    )
    p.add_argument("--no-spark", action="store_true", help="skip the Spark job and the table check")
    p.add_argument("--no-unshare", action="store_true", help="do not re-execute in a mount namespace")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    return p


def source_choice(name: str) -> tuple[str, str]:
    """``--source`` as ChaosOptions' (source, kafka_broker): ``kafka`` is a Kafka source on Apache
    Kafka, ``tansu`` one on Tansu, ``mqd`` the mqd brokers (kafka_broker unused)."""
    if name == "tansu":
        return "kafka", "tansu"
    return name, "apache"


def _maybe_unshare(args: argparse.Namespace) -> None:
    if args.no_unshare or args.topology == "hosts" or os.environ.get(_NS_ENV) or os.geteuid() != 0:
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        return
    env = {**os.environ, _NS_ENV: "1"}
    argv = [unshare, "-m", "--propagation", "private", sys.executable, "-m", "mqd_dev.chaos", *sys.argv[1:]]
    os.execve(unshare, argv, env)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _maybe_unshare(args)
    mqdlog.configure("info", "console" if sys.stderr.isatty() else "json")
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    if args.topology == "hosts":
        from mqd_dev.chaos.hosts_topology import hosts_main

        return hosts_main(args, seed, args.root or Path(tempfile.mkdtemp(prefix="mqd-chaos-hosts-")))
    source, kafka_broker = source_choice(args.source)
    try:
        options = ChaosOptions(
            root=args.root or Path("."),
            rounds=args.rounds,
            seed=seed,
            groups=args.groups,
            slaves=args.slaves,
            partitions=args.partitions,
            daemons=args.daemons,
            faults_per_round=args.faults_per_round,
            hold_min=args.hold_min,
            hold_max=args.hold_max,
            round_timeout=args.round_timeout,
            run_timeout=args.run_timeout,
            batch_records=args.batch_records,
            produce_interval=args.produce_interval,
            spark=not args.no_spark,
            kinds=expand_kinds(args.kinds, source, kafka_broker),
            landing=args.landing,
            source=source,
            kafka_storage=args.kafka_storage,
            kafka_broker=kafka_broker,
            group_protocol=args.group_protocol,
            landing_table=args.landing_table,
        )
        options.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    root = args.root or Path(tempfile.mkdtemp(prefix="mqd-chaos-"))
    options = dataclasses.replace(options, root=root)
    protocol = f", group protocol {args.group_protocol}" if source == "kafka" else ""
    print(f"chaos: seed {seed}, {args.rounds} rounds{protocol}, work dir {root}", flush=True)
    summary = asyncio.run(run_chaos(options))
    out = args.out or Path(tempfile.gettempdir()) / f"mqd-chaos-{seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(format_summary(summary), flush=True)
    print(f"summary JSON: {out}", flush=True)
    if summary["ok"] and not args.keep and args.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
