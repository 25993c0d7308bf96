"""A chaos run: real brokers and daemons on 127.0.0.1, seeded faults under a steady produce load.

Each round picks one to ``faults_per_round`` fault categories (daemon, broker, disk, network) and one
kind in each, applies them together for a seeded hold time, ends them, and measures the recovery:
the time from the faults' end (stopped processes restarted and healthy) until the landing directory
holds everything acknowledged before it and records produced after it (the daemons publish again).
At the end the load stops, every process is brought back, the daemons land the rest and stop, and
the producer's ledger of acknowledged records is checked against the landing files and (optionally)
the Spark table by payload id, and against the broker log (mqd_dev.chaos.check).

Fault kinds: the classic ones (processes, landing disk, network) are applied here; the data-safety
ones of issue 12 live in their own modules: ``node_data`` (master data-dir loss, a flipped byte or a
truncated closed segment, a topic recreated under the daemons), ``lock_freeze`` (a daemon frozen
while it holds a landing lock) and ``publish_kill`` (a fresh daemon killed before it publishes).
The integrity kinds of issue 31 live in ``integrity``: a claim of the landing deleted or overwritten
under the daemons (``claim_tamper``), the Spark checkpoint deleted under the streaming job
(``checkpoint_delete``); each ends with the operator's repair, so the end check still counts every
record.

``--landing s3`` (issue 15): the daemons land into ``s3://landing/chaos`` on a SeaweedFS the run
starts on 127.0.0.1 with two gateways, odd daemons publishing through the second (``s3_landing``);
the landing-disk kinds and ``lock_freeze`` need a local directory and are not drawn, the ``store``
kinds (``gateway_freeze``, ``gateway_kill``) hit the second gateway, and the end check reads the
landing through the store (visible files, manifest) and the Spark table through ``mqd spark --once``.

``--source kafka`` (issue 28; issue 14 for Tansu, ``--source tansu``): kafka_source.py runs the
same rounds and end check against three Apache Kafka brokers (apache_kafka.py), drawing
``APACHE_KAFKA_CATEGORIES``, or a Tansu broker, drawing ``KAFKA_CATEGORIES``, which the daemons
read with ``consumer.source = "kafka"``; what both
runs share is here as module functions (``landed_end``, ``caught_up``, ``stop_clean``,
``daemon_events``, ``spark_check``, ``format_summary``).

Determinism: the schedule (kinds, targets, hold times) comes from ``random.Random(seed)`` and
nothing else; what the faults hit inside a process depends on timing, which is not seeded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import structlog

from mqd.errors import MqdError
from mqd.landing import lifecycle
from mqd.landing.backends import open_store
from mqd.landing.local_objects import LocalObjects
from mqd.landing.objects import Objects
from mqd.landing.store import LandingStore
from mqd.process.runner import EXIT_TEMPFAIL
from mqd.testing import ProcessError, daemon_section, fast_consumer_timings, to_toml
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient, BrokerError
from mqd_dev.chaos import check, integrity, landing_table, node_data
from mqd_dev.chaos.apache_kafka import GROUP_PROTOCOLS
from mqd_dev.chaos.disk import LandingDisk
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.load import ProduceLoad
from mqd_dev.chaos.lock_freeze import freeze_in_lock
from mqd_dev.chaos.procs import BROKER_START_TIMEOUT, ChaosCluster, DaemonProc, Proc, spark_started_in_log
from mqd_dev.chaos.proxy import Faults
from mqd_dev.chaos.publish_kill import kill_before_publish, resolved_partitions
from mqd_dev.chaos.s3_landing import NOT_ON_S3, S3Landing

if TYPE_CHECKING:
    from mqd_dev.chaos.kafka_source import KafkaChaosRun

log = structlog.get_logger("mqd.chaos")

# One fault per category and round at most: two faults that stop broker nodes, or two that stop
# daemons, would step on each other's restarts.
CATEGORIES: dict[str, tuple[str, ...]] = {
    # claim_tamper restarts the daemons that report the break: no other daemon fault beside it
    "daemon": (
        "daemon_kill",
        "daemon_freeze",
        "daemon_churn",
        "lock_freeze",
        "kill_before_publish",
        "claim_tamper",
    ),
    "broker": (
        "master_kill",
        "slave_kill",
        "master_dir_loss",
        "segment_bitflip",
        "segment_truncate",
        "topic_recreate",
    ),
    "disk": ("landing_readonly", "landing_full"),
    "network": ("net_corrupt", "net_truncate", "net_reset", "net_slow", "net_hang"),
    # object-store landings only (s3_landing): the second S3 gateway frozen or killed
    "store": ("gateway_freeze", "gateway_kill"),
    # the streaming `mqd spark` beside the daemons SIGKILLed wherever it is (mid-batch, mid-compaction)
    "spark": ("spark_kill", "checkpoint_delete"),
}
STORE_KINDS: tuple[str, ...] = CATEGORIES["store"]
ALL_KINDS: tuple[str, ...] = tuple(k for kinds in CATEGORIES.values() for k in kinds)
# the data-safety kinds of issue 12, and the kinds before them (whose seeded plans stay as they were
# when only these are chosen)
SAFETY_KINDS: tuple[str, ...] = (
    "master_dir_loss",
    "segment_bitflip",
    "segment_truncate",
    "topic_recreate",
    "lock_freeze",
    "kill_before_publish",
)
CLASSIC_KINDS: tuple[str, ...] = tuple(k for k in ALL_KINDS if k not in SAFETY_KINDS)
# issue 31's: a claim object deleted or overwritten, the Spark checkpoint deleted (integrity.py)
INTEGRITY_KINDS: tuple[str, ...] = ("claim_tamper", "checkpoint_delete")
# a Kafka source (kafka_source.py): the daemons' faults, the network to Tansu (net_cut: every
# connection reset), Tansu itself; the mqd broker's storage faults and the landing disk are not drawn
KAFKA_CATEGORIES: dict[str, tuple[str, ...]] = {
    "daemon": ("daemon_kill", "daemon_freeze", "daemon_churn", "daemon_restart"),
    "broker": ("tansu_kill", "tansu_freeze"),
    "network": ("net_reset", "net_truncate", "net_slow", "net_hang", "net_cut"),
}
KAFKA_KINDS: tuple[str, ...] = tuple(k for kinds in KAFKA_CATEGORIES.values() for k in kinds)
# a Kafka source on Apache Kafka (apache_kafka.py, issue 28): the same daemon and network kinds, the
# brokers' own: a broker or a partition's leader SIGKILLed and restarted, a broker frozen past its
# session, an unclean election of a replica that left the ISR when it shrank to the leader
APACHE_KAFKA_CATEGORIES: dict[str, tuple[str, ...]] = {
    "daemon": KAFKA_CATEGORIES["daemon"],
    "broker": ("kafka_broker_kill", "kafka_leader_kill", "kafka_broker_freeze", "kafka_unclean_election"),
    "network": KAFKA_CATEGORIES["network"],
}
APACHE_KAFKA_KINDS: tuple[str, ...] = tuple(k for kinds in APACHE_KAFKA_CATEGORIES.values() for k in kinds)
SOURCES = ("mqd", "kafka")
KAFKA_BROKERS = ("apache", "tansu")
_FREEZES = ("daemon_freeze", "lock_freeze")
TABLE_LOG_TMPFS_MB = 32  # the landing tmpfs's room for the landing table's Delta log
# daemon log events the summary counts whatever their level: they show a fault took effect
_SHOWN_EVENTS = frozenset(
    {
        "pull node switched",
        "publish_conflict",
        "rebalanced",
        "revoked partition: unpublished records dropped",
        "group session expired; releasing partitions",
    }
)


def kafka_categories(kafka_broker: str) -> dict[str, tuple[str, ...]]:
    """The fault categories of a Kafka source on ``kafka_broker`` (``apache`` or ``tansu``)."""
    return APACHE_KAFKA_CATEGORIES if kafka_broker == "apache" else KAFKA_CATEGORIES


def expand_kinds(spec: str, source: str = "mqd", kafka_broker: str = "tansu") -> tuple[str, ...]:
    """``--kinds``: comma-separated kind names, category names (``broker``), ``classic``, ``safety``
    or ``all`` (a Kafka source: its broker's kinds and categories, ``all``); unknown names are kept,
    for ``ChaosOptions.validate`` to refuse them by name."""
    cats = kafka_categories(kafka_broker)
    aliases: dict[str, tuple[str, ...]] = (
        {**cats, "all": tuple(k for kinds in cats.values() for k in kinds)}
        if source == "kafka"
        else {
            **CATEGORIES,
            "all": ALL_KINDS,
            "classic": CLASSIC_KINDS,
            "safety": SAFETY_KINDS,
            "integrity": INTEGRITY_KINDS,
        }
    )
    out: list[str] = []
    for name in (n.strip() for n in spec.split(",")):
        for kind in aliases.get(name, (name,) if name else ()):
            if kind not in out:
                out.append(kind)
    return tuple(out)


_NET_FAULTS: dict[str, Faults] = {
    "net_corrupt": Faults(corrupt=0.05),
    "net_truncate": Faults(truncate=0.05),
    "net_reset": Faults(reset=0.05),
    "net_slow": Faults(delay=0.5, delay_s=0.4),
    "net_hang": Faults(blackhole=True),
}


@dataclass
class ChaosOptions:
    root: Path
    rounds: int = 20
    seed: int = 1
    groups: int = 2
    slaves: int = 1
    partitions: int = 4
    daemons: int = 2
    faults_per_round: int = 2
    hold_min: float = 2.0
    hold_max: float = 5.0
    round_timeout: float = 60.0  # recovery deadline of one round
    run_timeout: float = 1800.0
    settle_timeout: float = 120.0
    start_timeout: float = BROKER_START_TIMEOUT  # a broker's start and restart (procs.py)
    batch_records: int = 20
    produce_interval: float = 0.1  # per partition
    session_timeout: float = 3.0
    spark: bool = True
    spark_timeout: float = 600.0
    kinds: tuple[str, ...] = ALL_KINDS
    landing_tmpfs_mb: int = 32
    # small segments, so the segment faults find closed ones within seconds (~6 KB/s per partition)
    segment_bytes: int = 32 * 1024
    lock_window_timeout: float = 15.0  # lock_freeze: how long to watch for a held landing lock
    # lock_freeze lasts this long at least: the session expires (session_timeout), the next
    # rebalance (2 s) hands the frozen daemon's partitions over, their first publication follows
    lock_freeze_hold: float = 10.0
    landing: str = "local"  # "local" (a directory, tmpfs when root) or "s3" (SeaweedFS, s3_landing)
    source: str = "mqd"  # "mqd" (mqd brokers) or "kafka" (a Tansu, kafka_source.py)
    kafka_storage: str = "s3"  # a Kafka source's Tansu storage: "s3" (SeaweedFS) or "memory"
    # which broker a Kafka source runs: "apache" (3 Apache Kafka brokers, apache_kafka.py; what
    # `--source kafka` and `make chaos SOURCE=kafka` pick) or "tansu" (`--source tansu`); "tansu"
    # here, so that a ChaosOptions(source="kafka") written before Apache Kafka keeps its meaning
    kafka_broker: str = "tansu"
    # a Kafka source's consumer group protocol: "classic" (JoinGroup/SyncGroup, mqd's allocation
    # run by the group's leader) or "consumer" (KIP-848, the broker's assignor; Apache Kafka only)
    group_protocol: str = "classic"
    # landing.table of the daemons (issue 35): "delta" commits what they publish to a Delta table at
    # the landing's root, which the end check reads with delta-rs, DuckDB and Polars
    # (landing_table.py); "none": files only
    landing_table: str = "delta"
    # the table's commit interval in chaos: shorter than the default 5 s, so commits race faults
    table_commit_interval: float = 1.0

    @property
    def known_kinds(self) -> tuple[str, ...]:
        if self.source != "kafka":
            return ALL_KINDS
        return tuple(k for kinds in kafka_categories(self.kafka_broker).values() for k in kinds)

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source is mqd or kafka, not {self.source!r}")
        if self.kafka_broker not in KAFKA_BROKERS:
            raise ValueError(f"kafka_broker is apache or tansu, not {self.kafka_broker!r}")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(f"group_protocol is classic or consumer, not {self.group_protocol!r}")
        if self.group_protocol == "consumer" and (self.source != "kafka" or self.kafka_broker != "apache"):
            raise ValueError(
                "group_protocol consumer (KIP-848) runs with --source kafka (Apache Kafka) only: the mqd "
                "brokers have their own groups and Tansu does not speak it"
            )
        known = self.known_kinds
        unknown = set(self.kinds) - set(known)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(known)}")
        if self.source == "kafka" and self.landing != "local":
            raise ValueError("a Kafka source runs with a local landing only")
        if self.kafka_storage not in ("s3", "memory"):
            raise ValueError(f"kafka_storage is s3 or memory, not {self.kafka_storage!r}")
        if self.rounds < 0 or self.daemons < 1 or self.partitions < 1 or self.faults_per_round < 1:
            raise ValueError("rounds >= 0, daemons >= 1, partitions >= 1, faults_per_round >= 1")
        if self.landing not in ("local", "s3"):
            raise ValueError(f"landing is local or s3, not {self.landing!r}")
        if not 0 < self.hold_min <= self.hold_max:
            raise ValueError("need 0 < hold_min <= hold_max")
        if self.landing_table not in landing_table.TABLE_CHOICES:
            raise ValueError(f"landing_table is none or delta, not {self.landing_table!r}")


@dataclass
class RoundRecord:
    number: int
    kinds: list[str]
    hold_s: float
    recovery_s: float | None = None
    notes: list[str] = field(default_factory=list)


class ChaosRun:
    """Build in __init__; ``await run()`` does everything and always cleans up."""

    def __init__(self, options: ChaosOptions) -> None:
        options.validate()
        self.opts = options
        self.root = options.root.resolve()
        self.rng = random.Random(options.seed)  # what each round does
        self.target_rng = random.Random(options.seed + 1)  # whom it hits: plans do not depend on it
        self.topic = "chaos"
        self.cluster = ChaosCluster(
            self.root,
            topic=self.topic,
            partitions=options.partitions,
            groups=options.groups,
            slaves=options.slaves,
            seed=options.seed,
            node_settings={
                "liveness_interval_ms": 200,
                "liveness_timeout_ms": 1000,
                "replica_wait_ms": 300,
                "acks_all_timeout_ms": 3000,
                "log_level": "info",
                "log_format": "json",
                "storage": {
                    "fsync": "interval",
                    "fsync_interval_ms": 200,
                    "segment_bytes": options.segment_bytes,
                },
            },
        )
        self.landing = self.root / "landing"
        # the landing table's log shares the tmpfs: 7.7 MB after ~720 commits (a commit a second,
        # checkpoints every 100 of up to 1.2 MB kept for the log retention) filled 32 MiB by round 8
        tmpfs_mb = options.landing_tmpfs_mb + (TABLE_LOG_TMPFS_MB if options.landing_table == "delta" else 0)
        self.disk = LandingDisk(self.landing, tmpfs_mb)
        self.s3 = S3Landing(self.root) if options.landing == "s3" else None
        env = self.cluster.env if self.s3 is None else {**self.cluster.env, **self.s3.env()}
        self.daemons = [self._daemon(f"d{i}", env) for i in range(options.daemons)]
        self.extra = self._daemon(f"d{options.daemons}", env)  # joins and leaves (daemon_churn)
        # spark_kill: the table job streaming all run long, as in production (the end check's
        # `--once` then finds what the killed batches left)
        self.spark_job = (
            Proc(
                "spark",
                [
                    sys.executable,
                    "-m",
                    "mqd.operator.cli",
                    "spark",
                    "--config",
                    str(self.daemons[0].config_path),
                ],
                self.root / "spark-stream.log",
                self.root,
                env,
            )
            if options.spark and ("spark_kill" in options.kinds or "checkpoint_delete" in options.kinds)
            else None
        )
        self.client = BrokerClient(request_timeout=5.0)
        self.ledger = Ledger(self.root / "ledger.tsv")
        # kill_before_publish also hits the pipeline's very first start (see _first_start)
        self.first_start_kill = "kill_before_publish" in options.kinds
        self.setup_notes: list[str] = []
        self.load = ProduceLoad(
            self.client,
            self.cluster,
            batch_records=options.batch_records,
            interval=options.produce_interval,
            ledger=self.ledger,
            before_start=self.first_start_kill,
        )
        self.rounds: list[RoundRecord] = []
        self.faults: Counter[str] = Counter()
        self.failures: list[str] = []
        self.crashes: Counter[str] = Counter()
        self.start_refusals: Counter[str] = Counter()  # exits 75 at start (mqd.process.runner.EXIT_TEMPFAIL)
        self._supervisor: asyncio.Task[None] | None = None
        self._started = 0.0
        self.spark_hands_off = False  # an integrity fault stops and starts the streaming job itself
        # One integrity fault at a time takes the streaming job into its hands: drawn in one round,
        # claim_tamper and checkpoint_delete each judged the job the other had stopped, and the first
        # to end gave it back to the supervisor while the other's checkpoint was still deleted.
        self.spark_control = asyncio.Lock()

    # -- setup -------------------------------------------------------------------------------------

    def _daemon(self, name: str, env: dict[str, str]) -> DaemonProc:
        return DaemonProc(name, self.root / f"{name}.toml", self.root, env)

    def _write_daemon_config(self, d: DaemonProc) -> None:
        o = self.opts
        state = self.root / "state" / d.name
        warehouse = self.root / "warehouse"
        body = {
            "consumer": {
                "group": "chaos",
                "client_id": d.name,
                "bootstrap": self.cluster.urls,
                "topics": [self.topic],
                "consume_from": "last" if self.first_start_kill else "first",
                "session_timeout": o.session_timeout,
                **fast_consumer_timings(),
            },
            "landing": {
                "dir": str(self.landing) if self.s3 is None else self.s3.uri,
                "max_age": 0.5,
                "disk_retry_interval": 0.5,
                "table": o.landing_table,
            },
            "landing.delta": (
                {"commit_interval": o.table_commit_interval} if o.landing_table == "delta" else None
            ),
            # daemon i publishes through gateway i % 2 (s3_landing); to_toml writes [landing.s3]
            "landing.s3": self.s3.s3_section(int(d.name[1:])) if self.s3 is not None else None,
            "spark": {
                "master": "local[2]",
                "output_dir": str(warehouse / "events"),
                "checkpoint_dir": str(warehouse / "_checkpoints" / "events"),
                "quarantine_dir": str(warehouse / "_quarantine" / "events"),
                "shuffle_partitions": 2,
                "driver_memory": "512m",
                "trigger_interval": "1s",  # the streaming job of spark_kill
                "maintenance_interval": "10s",  # compaction runs under the faults too
            },
            "admin": {"enabled": False},
            "log": {"level": "info", "format": "json"},
            "daemon": daemon_section(state),
        }
        d.config_path.write_text(to_toml(body))

    async def _setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.s3 is not None:
            await asyncio.to_thread(self.s3.start)
            self.disk.reason = "not applicable on S3"
        else:
            self.disk.setup()
        if not self.disk.available:
            log.warning("chaos.disk_faults_unavailable", reason=self.disk.reason)
        await self.cluster.start(self.opts.start_timeout)
        for d in [*self.daemons, self.extra]:
            self._write_daemon_config(d)
        await self.client.start()
        if self.first_start_kill:
            await self._first_start()
        else:
            for d in self.daemons:
                d.start()
        if self.spark_job is not None:
            self.spark_job.start()
        self._supervisor = asyncio.create_task(self._supervise())
        self.load.start()
        # round 1 starts from a working pipeline, not from daemons still importing pyarrow
        await wait_until(lambda: self.load.acknowledged > 0, 30, "the first acknowledged produce")
        await self._caught_up(dict(self.load.acked_end), 60, "the daemons to start landing")

    async def _first_start(self) -> None:
        """The pipeline's first seconds with ``consume_from = "last"``: records acknowledged before
        the daemons start are not to land (ledger generation -1); the daemons resolve their start
        positions, fetch, and are SIGKILLed before their first publication while the load goes on;
        everything acknowledged after the resolution must land once they are back."""
        parts = list(range(self.opts.partitions))
        self.load.start()
        await wait_until(lambda: all(self.load.acked_end.values()), 30, "a first ack on every partition")
        await self.load.pause(parts)
        self.load.daemons_started()
        starts = {d.name: d.log_path.stat().st_size if d.log_path.exists() else 0 for d in self.daemons}
        for d in self.daemons:
            d.start()

        def resolved() -> bool:
            got = [resolved_partitions(d.log_path, starts[d.name]) for d in self.daemons]
            return set(parts) <= set().union(*got)

        await wait_until(resolved, 60, "the daemons' first start positions")
        self.load.resume(parts)
        await asyncio.sleep(0.2)  # fetched; publication comes at max_age (0.5 s)
        before = self.landed_end()
        for d in self.daemons:
            await d.stop_async(signal.SIGKILL)
        published = [p for p, end in self.landed_end().items() if end > before[p]]
        self.setup_notes.append(
            "kill_before_publish at the first start (consume_from=last): daemons SIGKILLed 0.2 s after "
            f"resolving their start positions; partitions published before the kill: {published}"
        )
        self.faults["kill_before_publish"] += 1
        await asyncio.sleep(1.0)  # acknowledged meanwhile: must land after the restart
        for d in self.daemons:
            d.start()

    async def _supervise(self) -> None:
        """Restart what exits unasked, like systemd's Restart=on-failure, and count it as a crash
        (an exit 75 at start, its source unreachable, is counted apart: the daemon's documented way)."""
        while True:
            await asyncio.sleep(0.2)
            for d in [*self.daemons, self.extra]:
                code = d.unasked_exit()
                if code == EXIT_TEMPFAIL:  # its source did not answer at start: restarted, not a crash
                    self.start_refusals[d.name] += 1
                    log.warning("chaos.daemon_start_refused", daemon=d.name)
                elif code is not None:
                    self.crashes[d.name] += 1
                    self.failures.append(f"daemon {d.name} exited by itself with {code}:\n{d.tail(20)}")
                    log.error("chaos.daemon_crashed", daemon=d.name, code=code)
                if code is not None:
                    if d is not self.extra:
                        d.start()
            hands_off = self.spark_hands_off
            code = self.spark_job.unasked_exit() if self.spark_job is not None and not hands_off else None
            if self.spark_job is not None and code is not None:
                self.crashes["spark"] += 1
                self.failures.append(
                    f"the streaming mqd spark exited by itself with {code}:\n{self.spark_job.tail(20)}"
                )
                log.error("chaos.spark_crashed", code=code)
                self.spark_job.start()
            for n in self.cluster.nodes.values():
                code = n.unasked_exit()
                if code is not None:
                    self.crashes[n.id] += 1
                    self.failures.append(f"node {n.id} exited by itself with {code}:\n{n.tail(20)}")
                    log.error("chaos.node_crashed", node=n.id, code=code)
                    n.start()

    # -- faults ------------------------------------------------------------------------------------

    def _available(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for cat, kinds in CATEGORIES.items():
            ok = [k for k in kinds if k in self.opts.kinds]
            if cat == "disk" and not self.disk.available:
                ok = []
            if not self.opts.slaves:
                ok = [k for k in ok if k != "slave_kill"]
            # a local landing has no gateway; an object store has no disk, mount or flock to fault
            skip = STORE_KINDS if self.s3 is None else NOT_ON_S3
            ok = [k for k in ok if k not in skip]
            if cat == "spark" and self.spark_job is None:
                ok = []
            if ok:
                out[cat] = ok
        return out

    def _plan_round(self) -> tuple[list[str], float]:
        available = self._available()
        cats = sorted(available)
        n = self.rng.randint(1, min(self.opts.faults_per_round, len(cats))) if cats else 0
        kinds = [self.rng.choice(available[c]) for c in sorted(self.rng.sample(cats, n))]
        hold = round(self.rng.uniform(self.opts.hold_min, self.opts.hold_max), 2)
        if any(k in _FREEZES for k in kinds):  # it must outlive the session, or it is no fault at all
            hold = max(hold, self.opts.session_timeout * 1.5 + 0.5)
        if "lock_freeze" in kinds:  # and long enough for the partitions whose locks are free to move
            hold = max(hold, self.opts.lock_freeze_hold)
        return kinds, hold

    async def _fault(self, kind: str, hold: float, rec: RoundRecord) -> None:
        """Apply ``kind`` for ``hold`` seconds, then undo it (restart what was stopped)."""
        rng = self.target_rng
        if kind in _NET_FAULTS:
            nodes = list(self.cluster.nodes.values())
            hit = nodes if kind != "net_hang" else [rng.choice(nodes)]
            rec.notes.append(f"{kind} on {[n.id for n in hit]}")
            for n in hit:
                n.proxy.faults = _NET_FAULTS[kind]
            try:
                await asyncio.sleep(hold)
            finally:
                for n in hit:
                    n.proxy.clear()
        elif kind in ("master_kill", "slave_kill"):
            candidates = self.cluster.masters() if kind == "master_kill" else self.cluster.slaves()
            node = rng.choice(candidates)
            rec.notes.append(f"{kind} {node.id}")
            await node.stop_async(signal.SIGKILL)
            await asyncio.sleep(hold)
            await self.cluster.restart(node, self.opts.start_timeout)
        elif kind == "spark_kill":
            assert self.spark_job is not None
            rec.notes.append("SIGKILL mqd spark")
            await self.spark_job.stop_async(signal.SIGKILL)
            await asyncio.sleep(hold)
            self.spark_job.start()
        elif kind == "daemon_kill":
            d = rng.choice(self.daemons)
            rec.notes.append(f"SIGKILL {d.name}")
            await d.stop_async(signal.SIGKILL)
            await asyncio.sleep(hold)
            d.start()
        elif kind == "daemon_freeze":
            d = rng.choice(self.daemons)
            rec.notes.append(f"SIGSTOP {d.name} for {hold}s")
            if d.running:
                d.send_signal(signal.SIGSTOP)
                await asyncio.sleep(hold)
                if d.running:
                    d.send_signal(signal.SIGCONT)
        elif kind == "daemon_churn":
            leaver = rng.choice(self.daemons)
            rec.notes.append(f"{self.extra.name} joins, {leaver.name} leaves and comes back")
            self.extra.start()
            await asyncio.sleep(hold / 2)
            await self._stop_clean(leaver)
            await asyncio.sleep(hold / 2)
            leaver.start()
            await self._stop_clean(self.extra)
        elif kind == "landing_readonly":
            rec.notes.append("landing read-only")
            await self.disk.make_readonly()
            try:
                await asyncio.sleep(hold)
            finally:
                await self.disk.make_writable()
        elif kind == "landing_full":
            filled = await self.disk.fill()
            rec.notes.append(f"landing full ({filled} filler bytes)")
            try:
                await asyncio.sleep(hold)
            finally:
                await self.disk.drain()
        elif kind == "claim_tamper":
            await self._claim_tamper(hold, rec)
        elif kind == "checkpoint_delete":
            await self._checkpoint_delete(hold, rec)
        elif kind in SAFETY_KINDS:
            await self._safety_fault(kind, hold, rec)
        elif kind in STORE_KINDS:
            await self._store_fault(kind, hold, rec)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    async def _store_fault(self, kind: str, hold: float, rec: RoundRecord) -> None:
        """An object-store landing's gateway fault: the second gateway (s3_landing) frozen or
        killed for ``hold`` seconds; the daemons publishing through it must lose nothing."""
        s3 = self.s3
        if s3 is None:
            raise ValueError(f"{kind} needs --landing s3")
        url = s3.server.endpoints[-1]
        if kind == "gateway_freeze":
            rec.notes.append(f"SIGSTOP S3 gateway {url} for {hold}s")
            s3.freeze_gateway()
            try:
                await asyncio.sleep(hold)
            finally:
                s3.thaw_gateway()
        else:
            rec.notes.append(f"SIGKILL S3 gateway {url}, restarted after {hold}s")
            await asyncio.to_thread(s3.kill_gateway)
            await asyncio.sleep(hold)
            await asyncio.to_thread(s3.restart_gateway)

    async def _safety_fault(self, kind: str, hold: float, rec: RoundRecord) -> None:
        """The data-safety kinds (issue 12): each a function of node_data, lock_freeze or
        publish_kill; this picks the target and holds."""
        rng = self.target_rng
        if kind == "master_dir_loss":
            node = rng.choice(self.cluster.masters())
            lost = self.root / "lost" / f"{node.id}-round{rec.number}"
            rec.notes.append(await node_data.master_dir_loss(self.cluster, node, lost))
            await asyncio.sleep(hold)
        elif kind in ("segment_bitflip", "segment_truncate"):
            node = rng.choice(list(self.cluster.nodes.values()))
            flip = kind == "segment_bitflip"
            rec.notes.append(await node_data.damage_segment(self.cluster, node, rng, flip=flip))
            await asyncio.sleep(hold)
        elif kind == "topic_recreate":
            await self._topic_recreate(rng.choice(self.cluster.group_names), hold, rec)
        elif kind == "lock_freeze":
            await self._lock_freeze(rng.choice(self.daemons), hold, rec)
        elif kind == "kill_before_publish":
            d = rng.choice(self.daemons)
            fetch_s = 0.2  # a fetch answers at once under the load; publication comes at max_age (0.5 s)
            rec.notes.append(await kill_before_publish(d, self.landed_end, fetch_s=fetch_s, timeout=20.0))
            await asyncio.sleep(hold)
            d.start()

    def _landing_objects(self) -> Objects:
        return self.s3.store.objects if self.s3 is not None else LocalObjects(self.landing)

    async def _claim_tamper(self, hold: float, rec: RoundRecord) -> None:
        async with self.spark_control:
            await self._claim_tamper_held(hold, rec)

    async def _claim_tamper_held(self, hold: float, rec: RoundRecord) -> None:
        """A partition's head claim deleted or overwritten (integrity.py): its owner stops it naming
        the object and publishes nothing after the break; the landing check lists it; the claim is
        put back and the reporters restart. A failure when anything was published past the break
        or the repair could not be made; a note when no daemon published to it meanwhile (a broker
        fault of the same round may hold its records back)."""
        rng = self.target_rng
        p, how = rng.randrange(self.opts.partitions), rng.choice(integrity.HOWS)
        objects = self._landing_objects()
        daemons = [*self.daemons, self.extra]
        starts = {d.name: integrity.log_size(d.log_path) for d in daemons}
        spark_start = integrity.log_size(self.spark_job.log_path) if self.spark_job is not None else 0
        self.spark_hands_off = True  # a Spark read of the broken claim refuses it: judged below
        try:
            try:
                t = await asyncio.to_thread(integrity.tamper_head, objects, self.topic, p, how)
            except OSError as exc:  # landing_full or landing_readonly of the same round
                rec.notes.append(f"claim_tamper: the landing refused the tamper ({exc}); none made")
                await asyncio.sleep(hold)
                return
            if t is None:
                rec.notes.append(f"claim_tamper: partition {p}'s chain too short for {how}")
                await asyncio.sleep(hold)
                return
            rec.notes.append(
                f"claim_tamper: {how} head claim {t.key}" + (f" (raced {t.raced})" if t.raced else "")
            )

            def reporters() -> list[DaemonProc]:
                return [d for d in daemons if integrity.reported(d.log_path, starts[d.name], t)]

            try:
                await wait_until(lambda: bool(reporters()), max(hold, 15.0), "a daemon to report the break")
            except TimeoutError:
                rec.notes.append("claim_tamper: no daemon published to the partition meanwhile")
            await asyncio.sleep(hold)
            past = await asyncio.to_thread(integrity.published_past, objects, self.topic, t)
            if past and not t.raced:
                self.failures.append(
                    f"round {rec.number}: claim_tamper: claims {past} published past {t.key}"
                )
            if not await asyncio.to_thread(integrity.landing_check_names, objects, t):
                self.failures.append(f"round {rec.number}: claim_tamper: the landing check missed {t.key}")
            problem = await self._restore_claim(objects, t)
            if problem is not None:
                self.failures.append(f"round {rec.number}: claim_tamper: repair failed: {problem}")
            hit = reporters()
            rec.notes.append(f"claim_tamper: reported by {[d.name for d in hit]}; claim restored")
            for d in hit:  # a broken partition stays stopped until its daemon restarts
                await self._stop_clean(d)
                if d is not self.extra:
                    d.start()
            job = self.spark_job
            if job is not None and not job.running:
                if integrity.reported_by_spark(job.log_path, spark_start, t):
                    rec.notes.append(f"claim_tamper: the streaming mqd spark refused {t.key}; restarted")
                else:
                    self.failures.append(
                        f"the streaming mqd spark exited during claim_tamper:\n{job.tail(20)}"
                    )
                job.start()
        finally:
            self.spark_hands_off = False

    async def _restore_claim(self, objects: Objects, t: integrity.Tamper) -> str | None:
        """The operator's repair, tried again while a landing fault of the same round (full,
        read-only) refuses the write: seed 178805 drew landing_full beside claim_tamper, the repair
        met ENOSPC once and the partition stayed stopped to the end (40,820 records never landed)."""
        deadline = time.monotonic() + self.opts.round_timeout
        while True:
            try:
                return await asyncio.to_thread(integrity.restore, objects, t)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    return f"{t.key} could not be put back within {self.opts.round_timeout}s: {exc}"
            await asyncio.sleep(0.5)  # the other fault's hold ends on its own clock

    async def _checkpoint_delete(self, hold: float, rec: RoundRecord) -> None:
        async with self.spark_control:
            await self._checkpoint_delete_held(hold, rec)

    async def _checkpoint_delete_held(self, hold: float, rec: RoundRecord) -> None:
        """The Spark checkpoint deleted under the running streaming job (integrity.py): the restarted
        job must refuse naming it (exit 2); restoring the copy taken before lets it go on."""
        job = self.spark_job
        if job is None:
            raise ValueError("checkpoint_delete needs the streaming mqd spark")
        ckpt = self.root / "warehouse" / "_checkpoints" / "events" / "main"  # the main query's
        copy = self.root / "checkpoint-copies" / f"round{rec.number}"
        self.spark_hands_off = True
        try:
            if not job.running:
                job.start()
            await wait_until(
                lambda: job.running and lifecycle.last_committed_batch(ckpt) is not None,
                180,
                "the streaming mqd spark to commit a batch",
                interval=0.5,
            )
            await asyncio.to_thread(integrity.copy_checkpoint, job, ckpt, copy)
            await asyncio.to_thread(shutil.rmtree, ckpt)
            rec.notes.append(f"checkpoint_delete: {ckpt} deleted under the running job (copy {copy.name})")
            await asyncio.sleep(hold)
            await job.stop_async(signal.SIGKILL)
            start = integrity.log_size(job.log_path)
            job.start()
            await wait_until(lambda: not job.running, 180, "the restarted mqd spark to refuse", interval=0.5)
            code = job.poll()
            if code != 2 or not integrity.refused_naming(job.log_path, start, ckpt):
                self.failures.append(
                    f"round {rec.number}: checkpoint_delete: the restarted mqd spark exited {code} "
                    f"without refusing the checkpoint:\n{job.tail(20)}"
                )
            else:
                rec.notes.append(
                    "checkpoint_delete: the restarted job refused (exit 2) naming the checkpoint"
                )
            await asyncio.to_thread(integrity.restore_checkpoint, copy, ckpt)
            job.start()
            rec.notes.append("checkpoint_delete: checkpoint restored from the copy; job restarted")
        finally:
            self.spark_hands_off = False

    async def _topic_recreate(self, group: str, hold: float, rec: RoundRecord) -> None:
        """Drain the group's partitions into the landing (so the deletion loses nothing
        acknowledged), recreate them empty, and let the load go on under a new ledger generation."""
        parts = node_data.group_partitions(self.cluster, group)
        await self.load.pause(parts)
        try:
            target = {p: self.load.acked_end[p] for p in parts}
            try:
                what = f"{group} to land before topic_recreate"
                await self._caught_up(target, self.opts.round_timeout, what)
            except TimeoutError as exc:
                self.failures.append(f"round {rec.number}: topic_recreate went ahead undrained: {exc}")
            removed = await node_data.recreate_topic(self.cluster, group)
            self.load.new_generation(parts)
            rec.notes.append(f"topic_recreate on {group}: partitions {parts}, {len(removed)} folders removed")
        finally:
            self.load.resume(parts)
        await asyncio.sleep(hold)

    async def _lock_freeze(self, d: DaemonProc, hold: float, rec: RoundRecord) -> None:
        lock = await asyncio.to_thread(freeze_in_lock, d, self.landing, self.opts.lock_window_timeout)
        if lock is None:
            if not d.running:
                rec.notes.append(f"lock_freeze: {d.name} not running")
                await asyncio.sleep(hold)
                return
            d.send_signal(signal.SIGSTOP)
            rec.notes.append(f"lock_freeze: no lock window of {d.name} hit; SIGSTOP anyway for {hold}s")
        else:
            held = lock.relative_to(self.landing)
            rec.notes.append(f"lock_freeze: SIGSTOP {d.name} holding {held} for {hold}s")
        before = self.landed_end()
        await asyncio.sleep(hold)
        after = self.landed_end()
        moved = [p for p in before if after[p] > before[p]]
        rec.notes.append(f"lock_freeze: partitions landed meanwhile {moved}")
        if d.running:
            d.send_signal(signal.SIGCONT)
        # A frozen lock holder may stall its own partition, never the others (issue 12). Judged
        # only when nothing else in the round can stop landing.
        locked = int(lock.stem) if lock is not None and lock.stem.isdigit() else None
        stalled = [p for p in before if p not in moved and p != locked]
        if rec.kinds == ["lock_freeze"] and lock is not None and stalled:
            self.failures.append(
                f"round {rec.number}: {d.name} frozen for {hold}s holding {lock.name}: partitions "
                f"{stalled}, whose locks were free, landed nothing meanwhile"
            )

    async def _stop_clean(self, d: DaemonProc) -> int | None:
        return await stop_clean(d, self.failures, self.start_refusals)

    def _daemon_events(self) -> dict[str, int]:
        return daemon_events([*self.daemons, self.extra])

    # -- progress ----------------------------------------------------------------------------------

    def landed_end(self) -> dict[int, int]:
        """Per partition, the offset after the last published one (the store's head)."""
        store = self.s3.store if self.s3 is not None else open_store(self.landing)
        return landed_end(store, self.topic, self.opts.partitions)

    async def _caught_up(
        self, target: dict[int, int], timeout: float, what: str, *, beyond: bool = False
    ) -> float:
        return await caught_up(self.landed_end, target, timeout, what, beyond=beyond)

    async def _round(self, number: int) -> RoundRecord:
        kinds, hold = self._plan_round()
        rec = RoundRecord(number, kinds, hold)
        self.rounds.append(rec)
        log.info("chaos.round", round=number, kinds=kinds, hold_s=hold)
        self.faults.update(kinds)
        results = await asyncio.gather(*(self._fault(k, hold, rec) for k in kinds), return_exceptions=True)
        for kind, res in zip(kinds, results, strict=True):
            if isinstance(res, BaseException):
                self.failures.append(f"round {number}: applying {kind} failed: {res!r}")
        target = dict(self.load.acked_end)
        try:
            rec.recovery_s = round(
                await self._caught_up(
                    target, self.opts.round_timeout, f"round {number} recovery", beyond=True
                ),
                3,
            )
        except TimeoutError as exc:
            self.failures.append(
                f"round {number} ({', '.join(kinds)}): {exc}; landed {self.landed_end()}, acked {target}"
            )
        log.info("chaos.round_done", round=number, recovery_s=rec.recovery_s, notes=rec.notes)
        return rec

    # -- end ---------------------------------------------------------------------------------------

    async def _log_end(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in range(self.opts.partitions):
            url = self.cluster.master_of(p).direct_url
            r = await self.client.list_offsets(url, [{"topic": self.topic, "partition": p, "spec": "latest"}])
            out[p] = int(r[0]["offset"])
        return out

    async def _settle(self) -> dict[str, Any]:
        await self.load.stop()
        for n in self.cluster.nodes.values():
            n.proxy.clear()
            if not n.running:
                await self.cluster.restart(n, self.opts.start_timeout)
        await self.disk.make_writable()
        await self.disk.drain()
        for d in self.daemons:
            if d.frozen and d.running:
                d.send_signal(signal.SIGCONT)
            if not d.running:
                d.start()
        end = await self._log_end()
        try:
            took = await self._caught_up(end, self.opts.settle_timeout, "the daemons to land the whole log")
        except TimeoutError as exc:
            self.failures.append(f"final catch-up: {exc}; landed {self.landed_end()}, log end {end}")
            took = None
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
            self._supervisor = None
        codes = {}
        for d in [*self.daemons, self.extra]:
            if d.running:
                codes[d.name] = await self._stop_clean(d)
        if self.spark_job is not None and self.spark_job.running:
            # stopped (it drains its batch) before the end check's `--once`, which needs its lock;
            # not while its JVM starts after a spark_kill: SIGTERM before its handler kills it
            job = self.spark_job
            await wait_until(
                lambda: spark_started_in_log(job.log_path.read_bytes()) or not job.running,
                120,
                "the streaming mqd spark to start its query",
                interval=0.2,
            )
            codes["spark"] = await job.stop_async(signal.SIGTERM, timeout=120)
            if codes["spark"] != 0:
                self.failures.append(f"the streaming mqd spark stopped with {codes['spark']}")
        return {"log_end": end, "catch_up_s": took, "daemon_exit_codes": codes}

    async def _verify(self) -> dict[str, Any]:
        self.ledger.close()
        ledger = await asyncio.to_thread(read_ledger, self.ledger.path)
        url_of = {p: self.cluster.master_of(p).direct_url for p in range(self.opts.partitions)}
        damaged: list[str] = []
        log_tables = await check.read_log(self.client, url_of, self.topic, damaged)
        # acks of a generation the run deleted itself (topic_recreate) are not expected in the log
        current = [a for a in self.load.acks if max(a.generation, 0) == self.load.generation[a.partition]]
        log_check = check.check_log(log_tables, current)
        if self.s3 is not None:  # through the store, as the Spark job reads it
            landing = await asyncio.to_thread(self.s3.read_landing, self.topic)
            incarnations = await asyncio.to_thread(self.s3.incarnations, self.topic)
            for problem in await asyncio.to_thread(self.s3.manifest_vs_visible, self.topic):
                self.failures.append(f"object-store landing: {problem}")
        else:
            landing = await asyncio.to_thread(check.read_landing, self.landing, self.topic)
            incarnations = await asyncio.to_thread(check.landing_incarnations, self.landing, self.topic)
        landed = await asyncio.to_thread(check.check_payloads, ledger, landing)
        out: dict[str, Any] = {
            "log": log_check.to_json(),
            "landing": landed.to_json(),
            "landing_vs_log": check.compare(log_tables, landing).to_json(),
            "landing_incarnations": incarnations,
        }
        out["log"]["damaged"] = damaged
        if damaged:
            self.failures.append(f"the broker served damaged data: {damaged[:5]}")
        if log_check.acked_missing:
            self.failures.append(
                f"broker lost {log_check.acked_missing} acknowledged records: {log_check.examples}"
            )
        if not landed.ok:
            self.failures.append(f"landing vs the producer's ledger: {landed.examples}")
        out["replicas"] = await self._verify_replicas(log_tables)
        # a node that fenced a range it could not repair says so here (not a failure by itself)
        out["node_health"] = {
            n.id: {
                k: v
                for k, v in (await self.cluster.health(n, 2.0) or {"status": "no answer"}).items()
                if k in ("status", "reasons")
            }
            for n in self.cluster.nodes.values()
        }
        if self.opts.landing_table == "delta":
            out["landing_table"] = await self._verify_landing_table(ledger)
        if self.opts.spark:
            out["table"] = await self._spark(ledger, log_tables)
        else:
            out["table"] = {"skipped": "--no-spark"}
        return out

    async def _verify_landing_table(self, ledger: pa.Table) -> dict[str, Any]:
        """The landing table after the daemons stopped: one catch-up round over every chain, then
        its keys by delta-rs, DuckDB and Polars against the landing's and the ledger
        (landing_table.py)."""
        if self.s3 is not None:
            env = self.s3.env()
            store = landing_table.TableStore(
                self.s3.uri,
                endpoint=self.s3.endpoint_for(0),
                access_key=env["AWS_ACCESS_KEY_ID"],
                secret_key=env["AWS_SECRET_ACCESS_KEY"],
                region=env["AWS_REGION"],
            )
            s3_store = self.s3.store
            keys = await asyncio.to_thread(
                lambda: landing_table.landing_keys_store(
                    s3_store.objects, s3_store.visible_files(), self.topic
                )
            )
        else:
            store = landing_table.TableStore(str(self.landing.resolve()))
            keys = await asyncio.to_thread(landing_table.landing_keys_local, self.landing, self.topic)
        caught = await asyncio.to_thread(
            landing_table.catch_up, self._landing_objects(), store, self.topic, self.opts.partitions
        )
        res = await asyncio.to_thread(landing_table.check_table, store, keys, ledger, self.topic, caught)
        self.failures.extend(res.failures)
        return res.to_json()

    async def _verify_replicas(self, log_tables: dict[int, Any]) -> dict[str, Any]:
        """Every slave, once caught up, holds its master's log byte for byte (record for record)."""
        out: dict[str, Any] = {}
        for slave in self.cluster.slaves():
            parts = [p for p in range(self.opts.partitions) if self.cluster.master_of(p).group == slave.group]
            want = {p: log_tables[p].num_rows for p in parts}

            async def caught_up(slave_url: str = slave.direct_url, want: dict[int, int] = want) -> bool:
                try:
                    r = await self.client.list_offsets(
                        slave_url, [{"topic": self.topic, "partition": p, "spec": "latest"} for p in want]
                    )
                except BrokerError:
                    return False
                return all(int(e["offset"]) >= want[int(e["partition"])] for e in r)

            try:
                await wait_until(caught_up, 30, f"{slave.id} to catch up", interval=0.2)
            except TimeoutError as exc:
                self.failures.append(str(exc))
            damaged: list[str] = []
            slave_log = await check.read_log(
                self.client, {p: slave.direct_url for p in parts}, self.topic, damaged
            )
            if damaged:
                self.failures.append(f"slave {slave.id} served damaged data: {damaged[:5]}")
            copies = [check.as_copy(p, t) for p, t in slave_log.items()]
            cmp = check.compare({p: log_tables[p] for p in parts}, pa.concat_tables(copies))
            if not cmp.ok:
                self.failures.append(f"slave {slave.id} differs from its master: {cmp.examples}")
            out[slave.id] = {
                "distinct": cmp.distinct,
                "lost": cmp.lost,
                "mismatched": cmp.mismatched,
                "not_in_master_log": cmp.not_in_log,
            }
        return out

    async def _spark(self, ledger: pa.Table, log_tables: dict[int, Any]) -> dict[str, Any]:
        env = {**os.environ, **(self.s3.env() if self.s3 is not None else {})}
        return await spark_check(
            self.daemons[0].config_path,
            self.topic,
            self.root,
            env,
            ledger,
            log_tables,
            self.opts.spark_timeout,
            self.failures,
        )

    # -- the run -----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self._started = time.monotonic()
        deadline = self._started + self.opts.run_timeout
        result: dict[str, Any] = {}
        try:
            await asyncio.wait_for(self._body(deadline, result), self.opts.run_timeout + 60)
        except (ProcessError, BrokerError, OSError, TimeoutError) as exc:
            self.failures.append(f"run aborted: {type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug here must still end in a summary and a clean machine
            log.exception("chaos.internal_error")
            self.failures.append(f"run aborted by an internal error: {type(exc).__name__}: {exc}")
        finally:
            await self._cleanup()
        return self.summary(result)

    async def _body(self, deadline: float, result: dict[str, Any]) -> None:
        await self._setup()
        for i in range(1, self.opts.rounds + 1):
            if time.monotonic() > deadline:
                self.failures.append(f"run deadline reached after {i - 1} rounds")
                break
            await self._round(i)
        result["settle"] = await self._settle()
        result.update(await self._verify())

    async def _cleanup(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        await self.load.stop()
        self.ledger.close()
        for d in [*self.daemons, self.extra]:
            await d.stop_async(signal.SIGKILL)
        if self.spark_job is not None:
            await self.spark_job.stop_async(signal.SIGKILL)
        await self.cluster.stop()
        await self.client.close()
        if self.s3 is not None:
            await asyncio.to_thread(self.s3.stop)
        if self.failures and self.disk.available:  # the tmpfs dies with the run: keep a copy to look at
            await asyncio.to_thread(
                shutil.copytree,
                self.landing,
                self.root / "landing-copy",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns(".chaos-filler"),
            )
        self.disk.teardown()

    def kill_all_now(self) -> None:
        for d in [*self.daemons, self.extra]:
            d.kill_now()
        if self.spark_job is not None:
            self.spark_job.kill_now()
        self.cluster.kill_all_now()
        if self.s3 is not None:
            self.s3.stop()
        self.disk.teardown()

    def summary(self, result: dict[str, Any]) -> dict[str, Any]:
        recoveries = [r.recovery_s for r in self.rounds if r.recovery_s is not None]
        by_kind: dict[str, float] = {}
        for r in self.rounds:
            for k in r.kinds:
                if r.recovery_s is not None:
                    by_kind[k] = max(by_kind.get(k, 0.0), r.recovery_s)
        injected: Counter[str] = Counter()
        for n in self.cluster.nodes.values():
            injected.update(n.proxy.stats.injected)
        landing = result.get("landing", {})
        table = result.get("table", {})
        log_res = result.get("log", {})
        return {
            "ok": not self.failures,
            "seed": self.opts.seed,
            "rounds": len(self.rounds),
            "faults": {k: self.faults.get(k, 0) for k in sorted(self.opts.kinds)},
            "proxy_injected": dict(sorted(injected.items())),
            "landing": self.s3.summary() if self.s3 is not None else str(self.landing),
            "disk_faults": self.disk.reason if self.disk.available else f"unavailable: {self.disk.reason}",
            "records": {
                "acknowledged": self.load.acknowledged,
                "expected_in_landing": landing.get("acknowledged"),  # less the acks before the start
                "ledger": str(self.ledger.path),
                "produce_errors": dict(sorted(self.load.errors.items())),
                "in_log": log_res.get("records"),
                "unacknowledged_written": log_res.get("unacknowledged_written"),
                "acked_missing_from_log": log_res.get("acked_missing"),
                "landed_distinct": landing.get("distinct"),
                "unacknowledged_landed": landing.get("unacknowledged"),
                "losses": landing.get("lost"),
                "duplicates": landing.get("duplicates"),
                "moved": landing.get("moved"),
                "foreign": landing.get("foreign"),
                "mismatched": landing.get("moved", 0) + landing.get("foreign", 0) if landing else None,
            },
            "table": table,
            "landing_table": result.get(
                "landing_table",
                {"not checked": "the run ended before its end check"}
                if self.opts.landing_table == "delta"
                else {"off": "--landing-table none"},
            ),
            "landing_table_events": landing_table.table_events(
                d.log_path for d in [*self.daemons, self.extra]
            ),
            "replicas": result.get("replicas"),
            "node_health": result.get("node_health"),
            "landing_incarnations": result.get("landing_incarnations"),
            "max_recovery_s": max(recoveries) if recoveries else None,
            "max_recovery_s_by_kind": dict(sorted(by_kind.items())),
            "crashes": dict(self.crashes),
            "start_refusals": dict(self.start_refusals),
            "daemon_log_events": self._daemon_events(),
            "duration_s": round(time.monotonic() - self._started, 1),
            "setup_notes": self.setup_notes,
            "round_log": [asdict(r) for r in self.rounds],
            "settle": result.get("settle"),
            "failures": self.failures,
        }


async def stop_clean(d: DaemonProc, failures: list[str], refusals: Counter[str] | None = None) -> int | None:
    """SIGTERM ``d`` once it has started, and check that it drained and exited 0 (a failure in
    ``failures`` if not). Started first: a SIGTERM while the interpreter still imports (before the
    daemon installs its handlers) kills it with -15, which says nothing about how a daemon stops.
    A daemon that never started and exited 75 refused its start on its own (its source did not
    answer within its timeout), while this waited for it to start: counted in ``refusals``."""
    if d.running:
        try:
            # or to exit by itself: a start its source refused (below) needs no 30 s wait
            await wait_until(lambda: d.started() or not d.running, 30.0, f"{d.name} to start", interval=0.1)
        except TimeoutError:
            log.warning("chaos.daemon_not_started", daemon=d.name)
    code = await d.stop_async(signal.SIGTERM, timeout=20.0)
    if code == EXIT_TEMPFAIL and not d.started():
        if refusals is not None:
            refusals[d.name] += 1
        log.warning("chaos.daemon_start_refused", daemon=d.name)
    elif code not in (0, None):  # a daemon told to stop must drain, commit and exit 0
        failures.append(f"daemon {d.name} exited with {code} on SIGTERM:\n{d.tail(20)[-2000:]}")
    return code


def daemon_events(daemons: list[DaemonProc], shown: frozenset[str] = frozenset()) -> dict[str, int]:
    """Warnings and errors the daemons logged, and the events that show a fault took effect
    (``_SHOWN_EVENTS`` and ``shown``)."""
    counts: Counter[str] = Counter()
    for d in daemons:
        try:
            lines = d.log_path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            event = (str(rec.get("event", "")).splitlines() or [""])[0][:80]
            if rec.get("level") in ("warning", "error") or event in _SHOWN_EVENTS or event in shown:
                counts[event] += 1
    return dict(counts.most_common(20))


def landed_end(store: LandingStore, topic: str, partitions: int) -> dict[int, int]:
    """Per partition, the offset after the last published one (the store's head)."""
    out: dict[int, int] = {}
    for p in range(partitions):
        try:
            last = store.head(topic, p).last_offset
        except (MqdError, OSError):
            last = None
        out[p] = 0 if last is None else int(last) + 1
    return out


async def caught_up(
    landed: Callable[[], dict[int, int]],
    target: dict[int, int],
    timeout: float,
    what: str,
    *,
    beyond: bool = False,
) -> float:
    """Wait until every partition has landed up to ``target``; with ``beyond``, also until some
    partition has landed past it (records produced after the fault: the pipeline flows again).
    Returns the seconds it took."""
    started = time.monotonic()

    async def done() -> bool:
        now = landed()
        if not all(now[p] >= end for p, end in target.items()):
            return False
        return not beyond or any(now[p] > end for p, end in target.items())

    await wait_until(done, timeout, what, interval=0.1)
    return time.monotonic() - started


async def spark_check(
    config: Path,
    topic: str,
    root: Path,
    env: dict[str, str],
    ledger: pa.Table,
    log_tables: dict[int, Any],
    timeout: float,
    failures: list[str],
    *,
    lossy: Collection[tuple[int, int]] = (),
) -> dict[str, Any]:
    """Run ``mqd spark --once`` with the daemons' config and check the table it committed against
    the producer's ledger (``check.check_payloads``, ``lossy`` as there) and the source log."""
    argv = [sys.executable, "-m", "mqd.operator.cli", "spark", "--config", str(config), "--once"]
    spark_log = root / "spark.log"
    started = time.monotonic()
    with open(spark_log, "ab") as fh:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=root, env=env
        )
        try:
            code = await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            failures.append(f"mqd spark --once did not finish in {timeout}s")
            return {"error": "timeout"}
    if code != 0:
        tail = spark_log.read_text(errors="replace")[-3000:]
        failures.append(f"mqd spark --once exited with {code}:\n{tail}")
        return {"error": f"exit {code}"}
    output = root / "warehouse" / "events"
    table = await asyncio.to_thread(check.read_table_output, output, topic)
    res = await asyncio.to_thread(check.check_payloads, ledger, table, lossy)
    if not res.ok:
        failures.append(f"table vs the producer's ledger: {res.examples}")
    return {
        **res.to_json(),
        "mismatched": res.moved + res.foreign,
        "vs_log": check.compare(log_tables, table).to_json(),
        "spark_s": round(time.monotonic() - started, 1),
    }


def format_summary(s: dict[str, Any]) -> str:
    r = s["records"]
    t = s.get("table") or {}
    table = (
        (
            f"table: distinct {t.get('distinct')}, lost {t.get('lost')}, duplicated {t.get('duplicates')}, "
            f"at another offset {t.get('moved')}, foreign {t.get('foreign')}"
        )
        if "distinct" in t
        else f"table: {t}"
    )
    lines = [
        f"chaos {'PASSED' if s['ok'] else 'FAILED'}: seed {s['seed']}, {s['rounds']} rounds, "
        f"{s['duration_s']}s",
        f"source: {s.get('source', 'mqd brokers')}",
        "faults: " + ", ".join(f"{k} {v}" for k, v in s["faults"].items()),
        "proxy injected: " + (", ".join(f"{k} {v}" for k, v in s["proxy_injected"].items()) or "none"),
        f"landing: {s.get('landing')}",
        f"disk faults: {s['disk_faults']}",
        f"records (producer ledger): acknowledged {r['acknowledged']} "
        f"({r.get('expected_in_landing')} expected in the landing), in log {r['in_log']} "
        f"({r['unacknowledged_written']} written but not acknowledged), "
        f"landed distinct {r['landed_distinct']} ({r['unacknowledged_landed']} not acknowledged)",
        f"landing: lost {r['losses']}, duplicated {r['duplicates']}, at another offset {r['moved']}, "
        f"foreign {r['foreign']}; acknowledged missing from the log {r['acked_missing_from_log']}"
        + (
            f"; gone with a destroyed source log {r['gone_with_source']}" if r.get("gone_with_source") else ""
        ),
        table,
        *(
            [landing_table.summary_line(s["landing_table"], s.get("landing_table_events"))]
            if "landing_table" in s
            else []
        ),
        "replicas: "
        + (
            ", ".join(
                f"{k} lost {v['lost']} mismatched {v['mismatched']}"
                for k, v in (s.get("replicas") or {}).items()
            )
            or "none"
        ),
        "node health: "
        + ", ".join(
            f"{k} {v.get('status')}" + (f" {v['reasons']}" if v.get("reasons") else "")
            for k, v in (s.get("node_health") or {}).items()
        ),
        "landed incarnations per partition: "
        + (", ".join(f"{p}: {len(v)}" for p, v in (s.get("landing_incarnations") or {}).items()) or "none"),
        f"max recovery: {s['max_recovery_s']}s; by kind: {s['max_recovery_s_by_kind']}",
        *(
            [
                f"kafka brokers restarted: {s['broker_restarts']}; "
                f"leaders elected: {s.get('elections') or 'none'}"
            ]
            if s.get("broker_restarts")
            else []
        ),
        f"crashes: {s['crashes'] or 'none'}",
        f"start refusals (source down at start, exit 75, restarted): {s.get('start_refusals') or 'none'}",
        "daemon log: "
        + (", ".join(f"{k} {v}" for k, v in s.get("daemon_log_events", {}).items()) or "quiet"),
    ]
    lines.extend(
        f"the source lost acknowledged records (not mqd): {x}" for x in r.get("lost_by_source") or []
    )
    lines.extend(f"set-up: {n}" for n in s.get("setup_notes", []))
    lines.extend(f"FAILURE: {f}" for f in s["failures"])
    return "\n".join(lines)


async def run_chaos(options: ChaosOptions) -> dict[str, Any]:
    chaos: ChaosRun | KafkaChaosRun
    if options.source == "kafka":
        from mqd_dev.chaos.kafka_source import KafkaChaosRun  # imports this module

        chaos = KafkaChaosRun(options)
    else:
        chaos = ChaosRun(options)
    try:
        return await chaos.run()
    finally:
        chaos.kill_all_now()
