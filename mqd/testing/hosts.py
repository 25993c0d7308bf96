"""Many hosts on one machine: Kafka brokers, mqd daemons, an object store and Spark, each on its own
network host, to be cut apart, slowed, frozen and killed (supported API; root needed).

Every test before this rig put all parts on one network stack, where the network could fail only
through a proxy and no host could lose some peers but not others. :class:`HostRig` puts each part
on a host of its own (a network namespace with its own address on a shared bridge:
:mod:`mqd.testing.hosts_net`), which is what a deployment across machines looks like::

    with HostRig(tmp_path, partitions=6) as rig:       # 3 Kafka, 1 SeaweedFS, 3 daemon hosts
        rig.start_daemons()                            # `mqd run` on d0, d1, d2: one group
        ...                                            # produce to rig.bootstrap (from the test)
        rig.host("d1").cut(rig.coordinator_host())     # d1 <-> group coordinator only
        rig.host("d2").isolate()                       # d2 reaches nobody
        rig.host("d0").loss(rig.host("s3"), 0.2)       # 20 % of d0's packets to S3 dropped
        rig.host("k1").kill(); rig.kafka.start_broker(1)   # a broker host lost, started again
        rig.host("d0").freeze(); rig.host("d0").thaw()     # SIGSTOP / SIGCONT a host's processes
        rig.host("d2").step_clock(600); rig.restart_daemon(2)  # d2's clock 10 min ahead
        rig.heal()
        landed = rig.landed_end()                      # per partition, the landing's head + 1
        table = rig.read_landing()                     # (partition, offset, value) of every file

Hosts: ``k0``..``k2`` (:class:`~mqd.testing.hosts_services.HostKafkaCluster`, Apache Kafka 4.4
in KRaft mode, every broker a voter, the topic replicated 3 times with ``min.insync.replicas`` 2),
``s3`` (:class:`~mqd.testing.hosts_services.HostSeaweedFS`), ``d0``..``d<n-1>`` (one ``mqd run``
each, :meth:`HostRig.daemon_config`), and with ``spark_workers`` a ``spark`` host (a Spark
standalone master, :class:`~mqd.testing.hosts_spark.HostSpark`, and the ``mqd spark`` driver) and
``w0``.. (one worker each). The test process
is on the bridge too (:attr:`HostNetwork.address`): it produces, reads the landing and checks, and
is never faulted. Delay and jitter go through mqd's fault proxy on the link
(:meth:`HostNetwork.proxy`). Daemons run under libfaketime when the machine has it, at offset 0
until :meth:`~mqd.testing.hosts_net.NetHost.step_clock`.

Everything (processes, namespaces, bridge) goes at :meth:`HostRig.close` (the ``with`` block's
end), also after a failed start; :func:`~mqd.testing.hosts_net.missing_requirements` is the skip
reason where the machine cannot run a rig.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

from mqd.testing.configfiles import daemon_section, fast_consumer_timings, to_toml
from mqd.testing.hosts_net import HostNetwork, NetHost, faketime_library
from mqd.testing.hosts_services import HostKafkaCluster, HostSeaweedFS
from mqd.testing.hosts_spark import HostSpark
from mqd.testing.kafka_cluster import JVM_FLAGS
from mqd.testing.process import ManagedProcess
from mqd.waiting import wait_until_sync

TOPIC = "events"
OFFSETS_PARTITIONS = 50  # Kafka's offsets.topic.num.partitions (KafkaCluster leaves the default)


def _java_hash(text: str) -> int:
    """``String.hashCode`` of ``text`` made non-negative as Kafka's ``Utils.abs`` does (the
    absolute value; 0 for the smallest int)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if signed == -(1 << 31) else abs(signed)


_STARTED = b'"daemon started"'
_BANNER = b"===== start "


class HostRig:
    """The many-hosts topology (see the module docstring).

    - ``partitions``: of the first stream's topic :data:`TOPIC` (replication 3,
      ``min.insync.replicas`` 2); :meth:`use_stream` starts over on another.
    - ``daemons``: how many ``mqd run`` hosts (one consumer group, named as the topic).
    - ``session_timeout``: the daemons' group session (seconds).
    - ``group_protocol``: ``classic`` or ``consumer`` (KIP-848).
    - ``daemon_settings``: tables merged over :meth:`daemon_config` (``{"landing": {...}}``).
    - ``kafka_heap``: each broker's ``-Xmx`` (256m holds a few hundred partitions; 1,000
      partitions replicated 3 times need more).
    - ``spark_workers``: more than 0 adds a ``spark`` host (a Spark standalone master, and the
      ``mqd spark`` driver: :meth:`spark_driver`) and that many worker hosts ``w0``..
    """

    def __init__(
        self,
        root: Path,
        *,
        partitions: int = 6,
        daemons: int = 3,
        session_timeout: float = 3.0,
        group_protocol: str = "classic",
        daemon_settings: dict[str, dict[str, Any]] | None = None,
        spark_workers: int = 0,
        kafka_heap: str = "256m",
    ) -> None:
        self.root = Path(root).resolve()
        self.partitions = partitions
        self.session_timeout = session_timeout
        self.group_protocol = group_protocol
        self.daemon_settings = daemon_settings or {}
        self.net = HostNetwork(self.root)
        self.kafka: HostKafkaCluster | None = None
        self.s3: HostSeaweedFS | None = None
        self.daemons: list[ManagedProcess] = []
        self._n_daemons = daemons
        self._stream_settings: dict[str, dict[str, Any]] = {}
        self.spark_workers = spark_workers
        self.kafka_heap = kafka_heap
        self.spark: HostSpark | None = None
        self.topic = TOPIC
        self.group = TOPIC
        self.uri = f"s3://landing/{TOPIC}"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> HostRig:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.net.start()
        kafka_hosts = [self.net.add_host(f"k{i}") for i in range(3)]
        s3_host = self.net.add_host("s3")
        for i in range(self._n_daemons):
            self.net.add_host(f"d{i}")
        settings = {"min.insync.replicas": "2"}
        if self.group_protocol == "consumer":
            settings |= {
                "group.consumer.session.timeout.ms": str(int(self.session_timeout * 1000) + 2000),
                "group.consumer.min.session.timeout.ms": "1000",
                "group.consumer.heartbeat.interval.ms": "500",
                "group.consumer.min.heartbeat.interval.ms": "100",
            }
        flags = tuple(f"-Xmx{self.kafka_heap}" if f.startswith("-Xmx") else f for f in JVM_FLAGS)
        self.kafka = HostKafkaCluster(self.root / "kafka", kafka_hosts, settings=settings, jvm_flags=flags)
        self.s3 = HostSeaweedFS(self.root / "seaweedfs", s3_host)
        self.kafka.start()
        self.s3.start()
        if self.spark_workers:
            master = self.net.add_host("spark")
            workers = [self.net.add_host(f"w{i}") for i in range(self.spark_workers)]
            # two task slots per worker: a task mostly waits on S3 and Python, the machine has 2 cores
            self.spark = HostSpark(self.root / "spark", master, workers, worker_cores=2, env=self.s3.env())
            self.spark.start()
        self.use_stream(TOPIC, self.partitions)

    def use_stream(
        self, name: str, partitions: int | None = None, settings: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Start over on a new topic ``name`` (``partitions``, default: as before), read by a
        group of that name into ``s3://landing/<name>``, with ``settings`` over the rig's
        ``daemon_settings``: every daemon is killed and made anew (not started). One rig serves
        several tests this way, each on a stream of its own."""
        assert self.kafka is not None, "start() first"
        for d in self.daemons:
            d.kill_now()
        self.daemons = []
        self.topic = self.group = name
        self.uri = f"s3://landing/{name}"
        self.partitions = partitions or self.partitions
        self._stream_settings = settings or {}
        self.kafka.create_topic(name, self.partitions, replication_factor=3)
        for i in range(self._n_daemons):
            self.daemons.append(self._daemon_process(i))

    def close(self) -> None:
        """Stop everything and remove the hosts. Idempotent."""
        for d in self.daemons:
            d.kill_now()
        if self.spark is not None:
            self.spark.stop()
        if self.kafka is not None:
            self.kafka.stop()
        if self.s3 is not None:
            self.s3.stop()
        self.net.close()

    def __enter__(self) -> HostRig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hosts -------------------------------------------------------------------------------------

    def host(self, name: str) -> NetHost:
        return self.net[name]

    @property
    def bootstrap(self) -> str:
        assert self.kafka is not None, "start() first"
        return self.kafka.bootstrap

    def assignment(self) -> dict[str, set[int]]:
        """Client id -> the partitions the group coordinator says each member owns; empty while the
        group is not stable or the coordinator does not answer (a broker cut or restarting)."""
        assert self.kafka is not None
        try:
            g = (
                self.kafka.admin()
                .describe_consumer_groups([self.group], request_timeout=3)[self.group]
                .result(5)
            )
        except Exception:
            return {}
        if "STABLE" not in str(g.state):
            return {}
        return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions} for m in g.members}

    def coordinator_host(self, group: str | None = None, timeout: float = 60.0) -> NetHost:
        """The host of the broker that coordinates ``group`` (default: the stream's) right now: the
        leader of the group's ``__consumer_offsets`` partition (Kafka's own placement: the group
        id's Java hash modulo the topic's partitions), read from the metadata, which answers
        while a DescribeConsumerGroups may fail for a while (NOT_COORDINATOR, a connection to a
        broker that was cut still timing out)."""
        assert self.kafka is not None
        kafka = self.kafka
        partition = _java_hash(group or self.group) % OFFSETS_PARTITIONS
        found: list[int] = []

        def led() -> bool:
            # not the leader itself as the condition: broker 0 is a leader, and 0 is falsy
            leader = kafka.leader("__consumer_offsets", partition, timeout=5.0)
            if leader is not None:
                found.append(leader)
            return leader is not None

        wait_until_sync(led, timeout, f"a leader of __consumer_offsets partition {partition}", interval=0.2)
        return kafka.hosts[found[-1]]

    def heal(self) -> None:
        """Lift every network fault and thaw every frozen process."""
        self.net.heal()
        for h in self.net.hosts.values():
            h.thaw()

    # -- daemons -----------------------------------------------------------------------------------

    def daemon_config(self, i: int) -> dict[str, Any]:
        """Daemon ``i``'s config (the TOML at ``root/d<i>.toml``): the Kafka source in the
        stream's group with static membership, landing on the ``s3`` host, the table config for
        ``mqd spark`` (on the spark host when there is one)."""
        assert self.s3 is not None
        state = self.root / "state" / f"d{i}"
        kafka: dict[str, Any] = {"group_instance_id": f"d{i}"}
        if self.group_protocol != "classic":
            kafka["group_protocol"] = self.group_protocol
        body: dict[str, Any] = {
            "consumer": {
                "source": "kafka",
                "group": self.group,
                "client_id": f"d{i}",
                "bootstrap": self.bootstrap.split(","),
                "topics": [self.topic],
                "consume_from": "first",
                "session_timeout": self.session_timeout,
                **fast_consumer_timings(),
            },
            "consumer.kafka": kafka,
            "landing": {"dir": self.uri, "max_age": 0.5, "disk_retry_interval": 0.5},
            "landing.s3": {"endpoint_url": self.s3.endpoint, "region": "us-east-1"},
            "spark": {
                "output_dir": str(self.root / "warehouse" / self.topic),
                "checkpoint_dir": str(self.root / "warehouse" / "_checkpoints" / self.topic),
                "quarantine_dir": str(self.root / "warehouse" / "_quarantine" / self.topic),
                "shuffle_partitions": 2,
                "driver_memory": "512m",
            },
            "admin": {"enabled": False},
            "log": {"level": "info", "format": "json"},
            "daemon": daemon_section(state),
        }
        if self.spark is not None:
            body["spark"]["master"] = self.spark.url
        for extra in (self.daemon_settings, self._stream_settings):
            for table, values in extra.items():
                body[table] = {**body.get(table, {}), **values}
        return body

    def config_path(self, i: int) -> Path:
        return self.root / f"{self.topic}-d{i}.toml"

    def _daemon_process(self, i: int) -> ManagedProcess:
        assert self.s3 is not None
        path = self.config_path(i)
        path.write_text(to_toml(self.daemon_config(i)))
        env = {**os.environ, **self.s3.env(), "PYTHONUNBUFFERED": "1"}
        return self.host(f"d{i}").process(
            f"d{i}",
            [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(path)],
            self.root / f"{self.topic}-d{i}.log",
            cwd=self.root,
            env=env,
            clock=faketime_library() is not None,
        )

    def start_daemons(self, timeout: float = 60.0) -> None:
        """Start every daemon that is not running and wait until each logged its start."""
        for d in self.daemons:
            if not d.running:
                d.start()
        for i in range(len(self.daemons)):
            self.wait_daemon_started(i, timeout)

    def daemon_started(self, i: int) -> bool:
        """Daemon ``i`` logged its start since its last (re)start."""
        try:
            log = self.daemons[i].log_path.read_bytes()
        except OSError:
            return False
        return _STARTED in log[log.rfind(_BANNER) :]

    def wait_daemon_started(self, i: int, timeout: float = 60.0) -> None:
        self.daemons[i].wait_ready(lambda: self.daemon_started(i), timeout, interval=0.1)

    def stop_daemon(self, i: int, timeout: float = 30.0) -> int | None:
        """SIGTERM (a daemon drains, commits and exits 0), SIGKILL after ``timeout``."""
        return self.daemons[i].stop(signal.SIGTERM, timeout)

    def restart_daemon(self, i: int, timeout: float = 60.0) -> None:
        """Stop daemon ``i`` if it runs (SIGTERM), start it again (with its host's clock offset)."""
        if self.daemons[i].running:
            self.stop_daemon(i)
        self.daemons[i].start()
        self.wait_daemon_started(i, timeout)

    # -- the landing -------------------------------------------------------------------------------

    def store(self) -> Any:
        """The landing as an :class:`mqd.landing.store.LandingStore` (read from the test
        process, across the bridge)."""
        from mqd.landing.s3_objects import S3Objects
        from mqd.landing.store import LandingStore

        assert self.s3 is not None
        return LandingStore(S3Objects(self.uri, client=self.s3.client()))

    def landed_end(self) -> dict[int, int]:
        """Per partition, the offset after the last one published (0: none yet)."""
        store = self.store()
        out = {}
        for p in range(self.partitions):
            try:
                last = store.head(self.topic, p).last_offset
            except OSError:
                last = None
            out[p] = 0 if last is None else int(last) + 1
        return out

    def wait_landed(self, target: dict[int, int], timeout: float, what: str = "the landing") -> None:
        """Until every partition has landed up to ``target`` (offsets after the last)."""

        def done() -> bool:
            now = self.landed_end()
            return all(now[p] >= end for p, end in target.items())

        wait_until_sync(done, timeout, f"{what} to reach {target}", interval=0.2)

    def read_landing(self) -> Any:
        """Every row of the visible data files: a pyarrow table (partition int32, offset int64,
        value binary)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        store = self.store()
        schema = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())])
        tables = []
        for key in store.visible_files():
            if not key.startswith(f"topic={self.topic}/"):
                continue
            got = store.objects.get(key)
            if got is None:
                raise FileNotFoundError(f"{self.uri}/{key} listed as visible but absent")
            t = pq.read_table(io.BytesIO(got[0]), columns=["partition", "offset", "value"])
            tables.append(t.select(["partition", "offset", "value"]).cast(schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def spark_driver(self, *args: str) -> ManagedProcess:
        """``mqd spark`` (not started) on the spark host with daemon 0's config, against the
        standalone master; ``args``: more of its options (``--once``)."""
        assert self.spark is not None, "HostRig(spark_workers=...) first"
        argv = [sys.executable, "-m", "mqd.operator.cli", "spark", "--config", str(self.config_path(0))]
        argv += ["--master", self.spark.url, *args]
        return self.spark.driver(argv, self.root / f"{self.topic}-spark.log")

    def table_path(self) -> Path:
        """The stream's table folder (``spark.output_dir``)."""
        return self.root / "warehouse" / self.topic

    def dump_logs(self, tail: int = 40) -> str:
        """The end of every log of the rig, for a failed test's output."""
        out = [f"--- {d.name} ---\n{d.tail(tail)}" for d in self.daemons]
        if self.kafka is not None:
            out.append(self.kafka.dump_logs(tail))
        if self.s3 is not None:
            out.append(self.s3.dump_logs(tail))
        if self.spark is not None:
            out.append(self.spark.dump_logs(tail))
        return "\n".join(out)
