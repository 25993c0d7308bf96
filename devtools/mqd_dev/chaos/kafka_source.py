"""The chaos run against a Kafka source (``python -m mqd_dev.chaos --source kafka|tansu``, issues 28, 14).

The same seeded rounds and end check as the mqd-broker run (runner.py): daemons with
``consumer.source = "kafka"`` in one consumer group (static membership: ``group_instance_id`` is
the daemon's name) read real Kafka-protocol brokers through fault proxies (proxy.py: the brokers
advertise the proxies' addresses, so every connection of the daemons and of the producer crosses
one), land into one local directory, and at the end the producer's ledger (ledger.py) is checked
against the landing files and the Spark table by payload id: nothing acknowledged lost, nothing
duplicated.

The brokers (``ChaosOptions.kafka_broker``): ``apache``, three Apache Kafka brokers and a controller
node (apache_kafka.py: its fault kinds, why a controller of its own, the proxies per broker), or
``tansu``, one Tansu (``TansuBroker``, below). Fault kinds (runner.APACHE_KAFKA_CATEGORIES,
runner.KAFKA_CATEGORIES): a daemon SIGKILLed, frozen past its session, restarted gracefully (static
membership keeps its share), or leaving while another joins; the network to the brokers reset, cut
short, slowed, hung or cut off; Apache Kafka: a broker or a partition's leader SIGKILLed and
restarted, a broker frozen, an unclean election; Tansu: SIGKILLed and restarted, or frozen.

Storage (``--kafka-storage``): ``s3`` (the default) runs Tansu on ``s3://tansu/`` in a SeaweedFS
the run starts on 127.0.0.1, so a killed Tansu comes back with its topics and records and a kill
must lose nothing; ``memory`` loses everything at a kill: the run then recreates the topic, and the
records acknowledged into the destroyed log that no daemon had fetched are gone from the source
(``check.check_payloads``'s ``lossy`` generations: what landed of a destroyed log must be a prefix
of it, the rest is counted as gone, not lost), and the landing shows one incarnation per log.

Group protocol (``--group-protocol``, Apache Kafka only): ``classic`` (the default: JoinGroup and
SyncGroup, mqd's allocation run by the group's leader) or ``consumer`` (KIP-848: the daemons set
``consumer.kafka.group_protocol = "consumer"`` and no ``consumer.allocation``, the coordinator runs
the broker's assignor and moves partitions one member at a time; the brokers' group session is
lowered to apache_kafka.GROUP_SESSION_S, and a daemon freeze holds past it, so a killed, frozen or
restarted daemon's partitions are reassigned by the broker within the round).

The producer is confluent-kafka with ``acks=all`` and idempotence; a record is in the ledger once
its delivery report says it is written, at the offset the report gives, never otherwise.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from mqd.landing.backends import open_store
from mqd.landing.local_objects import LocalObjects
from mqd.process.runner import EXIT_TEMPFAIL
from mqd.testing import daemon_section, fast_consumer_timings, to_toml
from mqd.testing.cluster import free_port
from mqd.testing.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS
from mqd.testing.tansu import tansu_binary
from mqd.waiting import wait_until
from mqd_dev.chaos import check, landing_table
from mqd_dev.chaos.apache_kafka import BROKER_MAY_LOSE, BROKER_SESSION_S, GROUP_SESSION_S, ApacheKafka
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.load import Ack, record_value
from mqd_dev.chaos.procs import DaemonProc, Proc
from mqd_dev.chaos.proxy import FaultProxy, Faults
from mqd_dev.chaos.runner import (
    _FREEZES,
    _NET_FAULTS,
    APACHE_KAFKA_CATEGORIES,
    KAFKA_CATEGORIES,
    ChaosOptions,
    RoundRecord,
    caught_up,
    daemon_events,
    kafka_categories,
    spark_check,
    stop_clean,
)

log = structlog.get_logger("mqd.chaos")

_KAFKA_NET_FAULTS: dict[str, Faults] = {
    **{k: v for k, v in _NET_FAULTS.items() if k in KAFKA_CATEGORIES["network"]},
    "net_cut": Faults(reset=1.0),  # every answer chunk resets its connection: the brokers unreachable
}
# delivery errors that say the broker lost the idempotent producer's state (a memory Tansu restarted)
_STATE_LOST = frozenset({"UNKNOWN_PRODUCER_ID", "OUT_OF_ORDER_SEQUENCE_NUMBER"})
# the Kafka source's log events the summary counts at any level: they show a fault took effect
_SHOWN = frozenset(
    {
        "consumer group joined",
        "left the group",
        "kafka fetch session reset",
        # KIP-848 (--group-protocol consumer): a new target from the coordinator, a leave
        "consumer group assignment",
        "left the consumer group",
    }
)


class TansuBroker:
    """Tansu on a private 127.0.0.1 port behind a :class:`FaultProxy`, advertising the proxy.

    ``storage`` "s3": ``s3://tansu/`` on a SeaweedFS started here (the data outlives the broker);
    "memory": Tansu's memory storage (a restart starts empty)."""

    kind = "tansu"

    def __init__(self, root: Path, storage: str, seed: int) -> None:
        self.root = root
        self.storage = storage
        self.port = free_port()
        # its port is fixed now: the producer and the daemon configs are built before start()
        self.proxy = FaultProxy(self.port, free_port(), seed=seed)
        self.store = SeaweedFS(root / "tansu-store", bucket="tansu") if storage == "s3" else None
        self.proc: Proc | None = None  # built in start(): the advertised address is the proxy's

    @property
    def bootstrap(self) -> str:
        """What every client uses: the proxy."""
        return f"127.0.0.1:{self.proxy.listen_port}"

    @property
    def check_bootstrap(self) -> str:
        """What the harness reads the log back through: the proxy (transparent by then)."""
        return self.bootstrap

    def set_faults(self, faults: Faults) -> None:
        self.proxy.faults = faults

    def clear_faults(self) -> None:
        self.proxy.clear()

    def injected(self) -> dict[str, int]:
        return dict(sorted(self.proxy.stats.injected.items()))

    async def create_topic(self, topic: str, partitions: int) -> None:
        await asyncio.to_thread(create_topic, self.bootstrap, topic, partitions, 20.0)

    def describe(self) -> str:
        if self.store is None:
            return "tansu, memory storage (a restart loses every record)"
        return f"tansu, s3://tansu/ on SeaweedFS {self.store.endpoint}"

    async def start(self) -> None:
        await self.proxy.start()
        env = {**os.environ}
        engine = "memory://tansu/"
        if self.store is not None:
            await asyncio.to_thread(self.store.start)
            engine = "s3://tansu/"
            env.update(
                AWS_ENDPOINT=self.store.endpoint,
                AWS_ALLOW_HTTP="true",
                AWS_ACCESS_KEY_ID=ACCESS_KEY,
                AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                AWS_DEFAULT_REGION=REGION,
            )
        argv = [tansu_binary(), "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}"]
        argv += ["--advertised-listener-url", f"tcp://{self.bootstrap}", "--storage-engine", engine]
        self.proc = Proc("tansu", argv, self.root / "tansu.log", self.root, env)
        await self.restart()

    async def restart(self, timeout: float = 30.0) -> None:
        assert self.proc is not None
        self.proc.start()

        async def listening() -> bool:
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            w.close()
            return True

        await self.proc.wait_ready_async(listening, timeout, interval=0.1)

    async def stop(self) -> None:
        if self.proc is not None:
            await self.proc.stop_async(signal.SIGTERM, timeout=10.0)
        await self.proxy.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.stop)

    def kill_now(self) -> None:
        if self.proc is not None:
            self.proc.kill_now()
        if self.store is not None:
            self.store.stop()


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    """Create ``topic`` (blocking; an existing topic is fine: a restarted s3 Tansu keeps it)."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    ).values():
        try:
            fut.result(timeout)
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


class KafkaLoad:
    """The steady produce load: every ``interval`` s, ``batch_records`` records per partition into
    an idempotent ``acks=all`` confluent-kafka producer; delivery reports (served by ``poll`` on
    the event loop) go to the ledger. A producer that hits a fatal error (its producer id unknown
    to a broker that lost its state) is replaced; its undelivered records are not acknowledged."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        batch_records: int,
        interval: float,
        ledger: Ledger,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.batch_records = batch_records
        self.interval = interval
        self.ledger = ledger
        self.acks: list[Ack] = []
        self.acked_end: dict[int, int] = {p: 0 for p in range(partitions)}
        self.generation: dict[int, int] = {p: 0 for p in range(partitions)}
        self.errors: Counter[str] = Counter()
        self.replaced_producers = 0
        self.acked_without_offset = 0
        self._offsetless_next: dict[int, int] = {}  # the number librdkafka gives next in such a batch
        self._seq: dict[int, int] = {p: 0 for p in range(partitions)}
        self._producer: Any = None
        self._fatal = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def acknowledged(self) -> int:
        return len(self.acks)

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        conf = {
            "bootstrap.servers": self.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 20000,
            "socket.timeout.ms": 5000,
            "error_cb": self._on_error,
            "logger": _QuietLogger(self.errors),
        }
        return Producer(conf)

    def _on_error(self, err: Any) -> None:
        self.errors[f"client:{err.name()}"] += 1
        if err.fatal():
            self._fatal = True

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors[err.name()] += 1
            if err.name() in _STATE_LOST:  # the broker forgot this producer: only a new one helps
                self._fatal = True
            return
        p, offset, value = msg.partition(), msg.offset(), msg.value()
        generation = self.generation[p]
        numbered_from_minus_one = offset is not None and offset == self._offsetless_next.get(p)
        if offset is None or offset < self.acked_end[p] or numbered_from_minus_one:
            # Written, but the answer names no offset: Tansu answers a retried batch it already had
            # with base offset -1, and librdkafka numbers the batch's records -1, 0, 1, ... from it
            # (an idempotent producer's acks of one partition come in order, so a real offset never
            # goes back). In the ledger at offset -1: the check looks for it at any offset.
            self.acked_without_offset += 1
            self._offsetless_next[p] = (offset if offset is not None and offset >= 0 else -1) + 1
            offset = -1
        else:
            self._offsetless_next.pop(p, None)
        self.acks.append(Ack(p, offset, 1, int(value[8:]), generation))
        self.ledger.record(self.topic, p, offset, [value], generation)
        self.acked_end[p] = max(self.acked_end[p], offset + 1)

    def start(self) -> None:
        self.ledger.start()
        if self._task is None:
            self._producer = self._new_producer()
            self._stop.clear()
            self._task = asyncio.create_task(self._run())

    @property
    def next_seq(self) -> dict[int, int]:
        """The payload sequence number each partition's next record gets."""
        return dict(self._seq)

    def drain_reports(self) -> None:
        """Serve the delivery reports that arrived (before the run changes the generation)."""
        if self._producer is not None:
            self._producer.poll(0)

    def new_generation(self) -> None:
        """The source log is gone (memory storage restarted): later acks are of a new generation,
        and a new producer makes them, since the broker forgot every producer id with its log (the
        old one went on retrying into UNKNOWN_PRODUCER_ID for ~60 s, a round's whole deadline:
        seed 908583 rounds 6 and 8, before and after session 12's changes alike)."""
        self.drain_reports()
        for p in self.generation:
            self.generation[p] += 1
            self.acked_end[p] = 0
        self._fatal = True

    async def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._produce_round()
            except Exception as exc:  # the load must outlive any client trouble: counted, logged
                self.errors[f"load:{type(exc).__name__}"] += 1
                log.warning("chaos.load_error", error=repr(exc))
            pause = max(0.0, self.interval - (time.monotonic() - started))
            try:
                await asyncio.wait_for(self._stop.wait(), pause)
            except TimeoutError:
                pass

    async def _produce_round(self) -> None:
        if self._fatal:
            await self._replace()
        for p in range(self.partitions):
            for _ in range(self.batch_records):
                value = record_value(p, self._seq[p])
                try:
                    self._producer.produce(self.topic, value, partition=p, on_delivery=self._delivered)
                except BufferError:
                    self.errors["queue_full"] += 1
                    break
                except Exception as exc:  # a fatal producer refuses records: replaced next turn
                    self.errors[f"produce:{type(exc).__name__}"] += 1
                    self._fatal = True
                    break
                self._seq[p] += 1
        self._producer.poll(0)

    async def _replace(self) -> None:
        old, self._producer = self._producer, None
        try:
            old.purge()  # its queued records fail (_PURGE_QUEUE): never acknowledged
        except Exception as exc:
            self.errors[f"purge:{type(exc).__name__}"] += 1
        await self._drain(old, 10.0)
        self._producer = self._new_producer()
        self._fatal = False
        self.replaced_producers += 1
        log.warning("chaos.producer_replaced", replaced=self.replaced_producers)

    async def _drain(self, producer: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(producer) and time.monotonic() < deadline:
            producer.poll(0)
            await asyncio.sleep(0.05)
        producer.poll(0)
        if len(producer):
            self.errors["undelivered_at_stop"] += len(producer)

    async def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._producer is not None:
            await self._drain(self._producer, timeout)
            self._producer = None
        self.ledger.flush()


class _QuietLogger:
    """librdkafka's log lines (connection refused while Tansu is down: thousands) counted, not printed."""

    def __init__(self, counts: Counter[str]) -> None:
        self.counts = counts

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.counts["client_log_lines"] += 1


def read_kafka_log(
    bootstrap: str, topic: str, want: dict[int, int], idle_s: float = 3.0, timeout: float = 120.0
) -> dict[int, pa.Table]:
    """Every record of every partition, ``{partition: table(offset, value)}``, read from offset 0
    until each partition reached ``want`` and nothing came for ``idle_s`` (Tansu's s3 storage
    answers a wrong high watermark, so the end is not asked for). Blocking."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-check",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
            "logger": _QuietLogger(Counter()),
        }
    )
    rows: dict[int, tuple[list[int], list[bytes]]] = {p: ([], []) for p in want}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in want])
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                reached = all((rows[p][0][-1] + 1 if rows[p][0] else 0) >= want[p] for p in want)
                if reached and time.monotonic() - last > idle_s:
                    break
                continue
            last = time.monotonic()
            partition, offset, value = msg.partition(), msg.offset(), msg.value()
            if partition is None or offset is None or value is None:
                continue  # chaos payloads always have a value
            offs, vals = rows[partition]
            offs.append(offset)
            vals.append(value)
    finally:
        c.close()
    schema = pa.schema([("offset", pa.int64()), ("value", pa.binary())])
    return {p: pa.table({"offset": o, "value": v}, schema=schema) for p, (o, v) in rows.items()}


class KafkaChaosRun:
    """Build in __init__; ``await run()`` does everything and always cleans up."""

    def __init__(self, options: ChaosOptions) -> None:
        options.validate()
        self.opts = options
        self.root = options.root.resolve()
        self.rng = random.Random(options.seed)
        self.target_rng = random.Random(options.seed + 1)
        self.topic = "chaos"
        self.broker: TansuBroker | ApacheKafka = (
            ApacheKafka(self.root, options.seed, group_protocol=options.group_protocol)
            if options.kafka_broker == "apache"
            else TansuBroker(self.root, options.kafka_storage, options.seed)
        )
        self.landing = self.root / "landing"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.daemons = [
            DaemonProc(f"d{i}", self.root / f"d{i}.toml", self.root, env) for i in range(options.daemons)
        ]
        n = options.daemons
        self.extra = DaemonProc(f"d{n}", self.root / f"d{n}.toml", self.root, env)  # daemon_churn
        self.ledger = Ledger(self.root / "ledger.tsv")
        self.load = KafkaLoad(
            self.broker.bootstrap,
            self.topic,
            options.partitions,
            batch_records=options.batch_records,
            interval=options.produce_interval,
            ledger=self.ledger,
        )
        self.rounds: list[RoundRecord] = []
        self.faults: Counter[str] = Counter()
        self.failures: list[str] = []
        self.crashes: Counter[str] = Counter()
        self.start_refusals: Counter[str] = Counter()  # exits 75 at start (mqd.process.runner.EXIT_TEMPFAIL)
        self.setup_notes: list[str] = []
        # (partition, generation) whose log a memory-storage restart destroyed (check.check_payloads)
        self.lossy: set[tuple[int, int]] = set()
        # per partition, the incarnations of destroyed logs: a landing head in one has landed
        # nothing of the current log
        self.dead_incarnations: dict[int, set[str | None]] = {p: set() for p in range(options.partitions)}
        self.lost_by_source: set[bytes] = set()  # acknowledged payloads Tansu's log did not hold
        self.log_tables: dict[int, pa.Table] = {}
        # (round, the next payload sequence number per partition at its start): whom a loss is near
        self._round_seqs: list[tuple[int, dict[int, int]]] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._started = 0.0

    # -- setup -------------------------------------------------------------------------------------

    def _write_daemon_config(self, d: DaemonProc) -> None:
        d.config_path.write_text(to_toml(self.daemon_config(d)))

    def daemon_config(self, d: DaemonProc) -> dict[str, Any]:
        """Daemon ``d``'s config. ``group_protocol`` consumer (KIP-848) sets
        ``consumer.kafka.group_protocol`` and no ``consumer.allocation`` (the broker assigns; config
        check refuses an mqd strategy under that protocol); classic leaves both to their defaults."""
        o = self.opts
        state = self.root / "state" / d.name
        warehouse = self.root / "warehouse"
        kafka: dict[str, Any] = {"group_instance_id": d.name}  # static membership
        if o.group_protocol != "classic":
            kafka["group_protocol"] = o.group_protocol
        body: dict[str, Any] = {
            "consumer": {
                "source": "kafka",
                "group": "chaos",
                "client_id": d.name,
                "bootstrap": self.broker.bootstrap.split(","),
                "topics": [self.topic],
                "consume_from": "first",
                "session_timeout": o.session_timeout,
                **fast_consumer_timings(),
            },
            "consumer.kafka": kafka,
            "landing": {
                "dir": str(self.landing),
                "max_age": 0.5,
                "disk_retry_interval": 0.5,
                "table": o.landing_table,
            },
            "landing.delta": (
                {"commit_interval": o.table_commit_interval} if o.landing_table == "delta" else None
            ),
            "spark": {
                "master": "local[2]",
                "output_dir": str(warehouse / "events"),
                "checkpoint_dir": str(warehouse / "_checkpoints" / "events"),
                "quarantine_dir": str(warehouse / "_quarantine" / "events"),
                "shuffle_partitions": 2,
                "driver_memory": "512m",
            },
            "admin": {"enabled": False},
            "log": {"level": "info", "format": "json"},
            "daemon": daemon_section(state),
        }
        return body

    async def _create_topic(self) -> None:
        await self.broker.create_topic(self.topic, self.opts.partitions)

    async def _setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        await self.broker.start()
        await self._create_topic()
        for d in [*self.daemons, self.extra]:
            self._write_daemon_config(d)
        for d in self.daemons:
            d.start()
        self._supervisor = asyncio.create_task(self._supervise())
        self.load.start()
        await wait_until(lambda: self.load.acknowledged > 0, 30, "the first acknowledged produce")
        await self._caught_up(dict(self.load.acked_end), 90, "the daemons to start landing")

    async def _supervise(self) -> None:
        """Restart what exits unasked (systemd's Restart=on-failure) and count it as a crash (an exit
        75 at start, Tansu unreachable, is counted apart: the daemon's documented way)."""
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
            if isinstance(self.broker, ApacheKafka):
                for i, code in self.broker.unasked_exits():
                    self.crashes[f"kafka-{i}"] += 1
                    node = self.broker.cluster.brokers[i]
                    self.failures.append(f"kafka-{i} exited by itself with {code}:\n{node.tail(20)}")
                    await self.broker.start_node(i)
                continue
            proc = self.broker.proc
            code = proc.unasked_exit() if proc is not None else None
            if proc is not None and code is not None:
                self.crashes["tansu"] += 1
                self.failures.append(f"tansu exited by itself with {code}:\n{proc.tail(20)}")
                await self._tansu_back(RoundRecord(0, ["crash"], 0.0))

    # -- progress ----------------------------------------------------------------------------------

    def landed_end(self) -> dict[int, int]:
        """Per partition, the offset after the last one landed from the current source log (0 while
        the landing's head is of a log a memory-storage restart destroyed)."""
        store = open_store(self.landing)
        out: dict[int, int] = {}
        for p in range(self.opts.partitions):
            try:
                head = store.head(self.topic, p)
            except OSError:
                out[p] = 0
                continue
            dead = head.incarnation in self.dead_incarnations[p]
            out[p] = 0 if head.last_offset is None or dead else int(head.last_offset) + 1
        return out

    def _head_incarnations(self) -> dict[int, str | None]:
        store = open_store(self.landing)
        return {p: store.head(self.topic, p).incarnation for p in range(self.opts.partitions)}

    async def _caught_up(
        self, target: dict[int, int], timeout: float, what: str, *, beyond: bool = False
    ) -> float:
        return await caught_up(self.landed_end, target, timeout, what, beyond=beyond)

    # -- faults ------------------------------------------------------------------------------------

    def _plan_round(self) -> tuple[list[str], float]:
        categories = kafka_categories(self.opts.kafka_broker)
        available = {c: [k for k in ks if k in self.opts.kinds] for c, ks in categories.items()}
        available = {c: ks for c, ks in available.items() if ks}
        cats = sorted(available)
        n = self.rng.randint(1, min(self.opts.faults_per_round, len(cats))) if cats else 0
        kinds = [self.rng.choice(available[c]) for c in sorted(self.rng.sample(cats, n))]
        hold = round(self.rng.uniform(self.opts.hold_min, self.opts.hold_max), 2)
        if any(k in _FREEZES for k in kinds):  # it must outlive the session, or it is no fault at all
            session = self.opts.session_timeout
            if self.opts.group_protocol == "consumer":  # the coordinator's session, not the daemon's
                session = max(session, GROUP_SESSION_S)
            hold = max(hold, session * 1.5 + 0.5)
        if "kafka_broker_freeze" in kinds:  # past the broker's session: fenced, its leaderships move
            hold = max(hold, BROKER_SESSION_S * 1.5 + 0.5)
        return kinds, hold

    async def _fault(self, kind: str, hold: float, rec: RoundRecord) -> None:
        rng = self.target_rng
        if kind in _KAFKA_NET_FAULTS:
            rec.notes.append(f"{kind} between the clients and the brokers")
            self.broker.set_faults(_KAFKA_NET_FAULTS[kind])
            try:
                await asyncio.sleep(hold)
            finally:
                self.broker.clear_faults()
        elif kind in APACHE_KAFKA_CATEGORIES["broker"]:
            assert isinstance(self.broker, ApacheKafka)
            await self.broker.fault(kind, hold, rec.notes, rng)
        elif kind == "tansu_kill":
            assert isinstance(self.broker, TansuBroker) and self.broker.proc is not None
            rec.notes.append(f"SIGKILL tansu ({self.opts.kafka_storage} storage), restarted after {hold}s")
            await self.broker.proc.stop_async(signal.SIGKILL)
            await asyncio.sleep(hold)
            await self._tansu_back(rec)
        elif kind == "tansu_freeze":
            assert isinstance(self.broker, TansuBroker) and self.broker.proc is not None
            rec.notes.append(f"SIGSTOP tansu for {hold}s")
            self.broker.proc.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(hold)
            finally:
                if self.broker.proc.running:
                    self.broker.proc.send_signal(signal.SIGCONT)
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
        elif kind == "daemon_restart":
            d = rng.choice(self.daemons)
            rec.notes.append(f"SIGTERM {d.name}, started again at once (static membership)")
            await stop_clean(d, self.failures, self.start_refusals)
            d.start()
            await asyncio.sleep(hold)
        elif kind == "daemon_churn":
            leaver = rng.choice(self.daemons)
            rec.notes.append(f"{self.extra.name} joins, {leaver.name} leaves and comes back")
            self.extra.start()
            await asyncio.sleep(hold / 2)
            await stop_clean(leaver, self.failures, self.start_refusals)
            await asyncio.sleep(hold / 2)
            leaver.start()
            await stop_clean(self.extra, self.failures, self.start_refusals)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    async def _tansu_back(self, rec: RoundRecord) -> None:
        """Start Tansu again; with memory storage its log is gone: the acks so far become a lossy
        generation, the landing heads' incarnations dead ones, and the topic is created anew."""
        assert isinstance(self.broker, TansuBroker)
        if self.broker.store is None:
            for p, inc in (await asyncio.to_thread(self._head_incarnations)).items():
                self.dead_incarnations[p].add(inc)
            self.lossy.update((p, g) for p, g in self.load.generation.items())
            self.load.new_generation()
        await self.broker.restart()
        if self.broker.store is None:
            await self._create_topic()
            rec.notes.append("memory storage: topic created anew, a new log generation")

    async def _round(self, number: int) -> RoundRecord:
        kinds, hold = self._plan_round()
        rec = RoundRecord(number, kinds, hold)
        self.rounds.append(rec)
        self._round_seqs.append((number, dict(self.load.next_seq)))
        log.info("chaos.round", round=number, kinds=kinds, hold_s=hold)
        self.faults.update(kinds)
        results = await asyncio.gather(*(self._fault(k, hold, rec) for k in kinds), return_exceptions=True)
        for kind, res in zip(kinds, results, strict=True):
            if isinstance(res, BaseException):
                self.failures.append(f"round {number}: applying {kind} failed: {res!r}")
        target = dict(self.load.acked_end)
        try:
            took = await self._caught_up(
                target, self.opts.round_timeout, f"round {number} recovery", beyond=True
            )
            rec.recovery_s = round(took, 3)
        except TimeoutError as exc:
            self.failures.append(
                f"round {number} ({', '.join(kinds)}): {exc}; landed {self.landed_end()}, acked {target}"
            )
        log.info("chaos.round_done", round=number, recovery_s=rec.recovery_s, notes=rec.notes)
        return rec

    # -- end ---------------------------------------------------------------------------------------

    async def _settle(self) -> dict[str, Any]:
        await self.load.stop()
        self.broker.clear_faults()
        if isinstance(self.broker, ApacheKafka):
            try:
                self.setup_notes.extend(f"at the end: {n}" for n in await self.broker.restore())
            except TimeoutError as exc:
                self.failures.append(f"the brokers did not come back in sync: {exc}")
        else:
            proc = self.broker.proc
            if proc is not None and proc.frozen and proc.running:
                proc.send_signal(signal.SIGCONT)
            if proc is not None and not proc.running:
                await self._tansu_back(RoundRecord(0, ["settle"], 0.0))
        for d in self.daemons:
            if d.frozen and d.running:
                d.send_signal(signal.SIGCONT)
            if not d.running:
                d.start()
        self.log_tables = await asyncio.to_thread(
            read_kafka_log, self.broker.check_bootstrap, self.topic, dict(self.load.acked_end)
        )
        end = {
            p: (int(t.column("offset")[-1].as_py()) + 1 if t.num_rows else 0)
            for p, t in self.log_tables.items()
        }
        try:
            took: float | None = await self._caught_up(
                end, self.opts.settle_timeout, "the daemons to land the whole log"
            )
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
                codes[d.name] = await stop_clean(d, self.failures, self.start_refusals)
        return {"log_end": end, "catch_up_s": took, "daemon_exit_codes": codes}

    async def _verify(self) -> dict[str, Any]:
        self.ledger.close()
        ledger = await asyncio.to_thread(read_ledger, self.ledger.path)
        current = [a for a in self.load.acks if a.generation == self.load.generation[a.partition]]
        in_log = {p: set(t.column("value").to_pylist()) for p, t in self.log_tables.items()}
        held = [a for a in current if record_value(a.partition, a.first_seq) in in_log[a.partition]]
        log_check = check.check_log(self.log_tables, [a for a in held if a.base_offset >= 0])
        # acknowledged without an offset: check_log counted them as written but not acknowledged
        log_check.unacknowledged_written -= sum(1 for a in held if a.base_offset < 0)
        # Acknowledged, yet not in the broker's log: the broker lost them (no daemon could read them,
        # or what one read is in the landing, not acknowledged). The broker is not mqd: reported, and
        # left out of what the landing and the table must hold. Apache Kafka must lose none: every
        # fault of its run stays inside its guarantee for acks=all and min.insync.replicas=2.
        lost = [a for a in current if record_value(a.partition, a.first_seq) not in in_log[a.partition]]
        log_check.acked_missing = len(lost)
        by_partition = Counter(a.partition for a in lost)
        log_check.examples = [
            f"partition {p}: {n} acknowledged records not in the log, from "
            f"{record_value(p, first)!r} (produced during {self._round_of(p, first)})"
            for p, n in sorted(by_partition.items())
            for first in [min(a.first_seq for a in lost if a.partition == p)]
        ]
        self.lost_by_source = {record_value(a.partition, a.first_seq) for a in lost}
        if lost and isinstance(self.broker, ApacheKafka) and not BROKER_MAY_LOSE:
            self.failures.append(
                f"Apache Kafka lost {len(lost)} acknowledged records (acks=all, min.insync.replicas 2; "
                f"not mqd, yet outside Kafka's guarantee): {log_check.examples}"
            )
        if lost:
            log.warning("chaos.source_lost_acknowledged", records=len(lost), examples=log_check.examples)
            keep = pc.invert(
                pc.is_in(ledger.column("payload"), pa.array(list(self.lost_by_source), pa.binary()))
            )
            ledger = ledger.filter(keep)
        landing = await asyncio.to_thread(check.read_landing, self.landing, self.topic)
        incarnations = await asyncio.to_thread(check.landing_incarnations, self.landing, self.topic)
        landed = await asyncio.to_thread(check.check_payloads, ledger, landing, self.lossy)
        out: dict[str, Any] = {
            "log": log_check.to_json(),
            "landing": landed.to_json(),
            "landing_incarnations": incarnations,
        }
        if not self.lossy:  # offsets are reused once a log is destroyed: then the landing holds more
            out["landing_vs_log"] = check.compare(self.log_tables, landing).to_json()
        if not landed.ok:
            self.failures.append(f"landing vs the producer's ledger: {landed.examples}")
        if self.opts.landing_table == "delta":
            store = landing_table.TableStore(str(self.landing.resolve()))
            keys = await asyncio.to_thread(landing_table.landing_keys_local, self.landing, self.topic)
            caught = await asyncio.to_thread(
                landing_table.catch_up, LocalObjects(self.landing), store, self.topic, self.opts.partitions
            )
            table_res = await asyncio.to_thread(
                landing_table.check_table, store, keys, ledger, self.topic, caught, self.lossy
            )
            self.failures.extend(table_res.failures)
            out["landing_table"] = table_res.to_json()
        if self.opts.spark:
            out["table"] = await spark_check(
                self.daemons[0].config_path,
                self.topic,
                self.root,
                {**os.environ},
                ledger,
                self.log_tables,
                self.opts.spark_timeout,
                self.failures,
                lossy=self.lossy,
            )
        else:
            out["table"] = {"skipped": "--no-spark"}
        return out

    def _round_of(self, partition: int, seq: int) -> str:
        """The round during which payload ``seq`` of ``partition`` was produced, with its kinds."""
        number = max((n for n, seqs in self._round_seqs if seqs[partition] <= seq), default=0)
        if number == 0:
            return "the set-up"
        return f"round {number}: {', '.join(self.rounds[number - 1].kinds)}"

    # -- the run -----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self._started = time.monotonic()
        deadline = self._started + self.opts.run_timeout
        result: dict[str, Any] = {}
        try:
            await asyncio.wait_for(self._body(deadline, result), self.opts.run_timeout + 60)
        except Exception as exc:  # a failed run must still end in a summary and a clean machine
            log.exception("chaos.run_aborted")
            self.failures.append(f"run aborted: {type(exc).__name__}: {exc}")
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
        await self.load.stop(timeout=5.0)
        self.ledger.close()
        for d in [*self.daemons, self.extra]:
            await d.stop_async(signal.SIGKILL)
        await self.broker.stop()

    def kill_all_now(self) -> None:
        for d in [*self.daemons, self.extra]:
            d.kill_now()
        self.broker.kill_now()

    def summary(self, result: dict[str, Any]) -> dict[str, Any]:
        recoveries = [r.recovery_s for r in self.rounds if r.recovery_s is not None]
        by_kind: dict[str, float] = {}
        for r in self.rounds:
            for k in r.kinds:
                if r.recovery_s is not None:
                    by_kind[k] = max(by_kind.get(k, 0.0), r.recovery_s)
        landing = result.get("landing", {})
        log_res = result.get("log", {})
        return {
            "ok": not self.failures,
            "seed": self.opts.seed,
            "source": self.broker.describe(),
            "rounds": len(self.rounds),
            "faults": {k: self.faults.get(k, 0) for k in sorted(self.opts.kinds)},
            "proxy_injected": self.broker.injected(),
            "landing": str(self.landing),
            "disk_faults": "not drawn with a Kafka source",
            "records": {
                "acknowledged": self.load.acknowledged,
                "expected_in_landing": landing.get("acknowledged"),
                "ledger": str(self.ledger.path),
                "produce_errors": dict(sorted(self.load.errors.items())),
                "producers_replaced": self.load.replaced_producers,
                "acknowledged_without_offset": self.load.acked_without_offset,
                "log_generations": max(self.load.generation.values(), default=0) + 1,
                "in_log": log_res.get("records"),
                "unacknowledged_written": log_res.get("unacknowledged_written"),
                "acked_missing_from_log": log_res.get("acked_missing"),
                "lost_by_source": log_res.get("examples") if log_res.get("acked_missing") else [],
                "landed_distinct": landing.get("distinct"),
                "unacknowledged_landed": landing.get("unacknowledged"),
                "gone_with_source": landing.get("gone_with_source"),
                "losses": landing.get("lost"),
                "duplicates": landing.get("duplicates"),
                "moved": landing.get("moved"),
                "foreign": landing.get("foreign"),
                "mismatched": landing.get("moved", 0) + landing.get("foreign", 0) if landing else None,
            },
            "table": result.get("table", {}),
            "landing_table": result.get(
                "landing_table",
                {"not checked": "the run ended before its end check"}
                if self.opts.landing_table == "delta"
                else {"off": "--landing-table none"},
            ),
            "landing_table_events": landing_table.table_events(
                d.log_path for d in [*self.daemons, self.extra]
            ),
            "replicas": {},
            "node_health": {},
            "landing_incarnations": result.get("landing_incarnations"),
            "landing_vs_log": result.get("landing_vs_log"),
            "max_recovery_s": max(recoveries) if recoveries else None,
            "max_recovery_s_by_kind": dict(sorted(by_kind.items())),
            "crashes": dict(self.crashes),
            "start_refusals": dict(self.start_refusals),
            "daemon_log_events": daemon_events([*self.daemons, self.extra], _SHOWN),
            "duration_s": round(time.monotonic() - self._started, 1),
            "setup_notes": self.setup_notes,
            "broker_restarts": dict(getattr(self.broker, "restarts", {})),
            "elections": dict(getattr(self.broker, "elections", {})),
            "round_log": [asdict(r) for r in self.rounds],
            "settle": result.get("settle"),
            "failures": self.failures,
        }
