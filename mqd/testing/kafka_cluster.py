"""Real Apache Kafka brokers on 127.0.0.1 for tests: KRaft mode, no ZooKeeper, no Kafka download.

Each broker is a JVM running ``kafka.Kafka`` from the jars Maven Central serves
(:mod:`mqd.testing.maven` resolves them into mqd's cache once: the first use needs network, later
ones are offline; ``python -m mqd.testing.kafka_cluster`` fetches them ahead). A broker is a combined
broker + controller node (``brokers=3``: three voters; ``controllers=1`` makes the others plain
brokers) on ephemeral 127.0.0.1 ports, with its config, data and log under ``root/broker-<i>/``.
Topics are created with confluent-kafka's admin client (dev extra)::

    with KafkaCluster(tmp_path) as kafka:
        kafka.create_topic("events", 12)
        ...  # point a producer and a daemon (consumer.source = "kafka") at kafka.bootstrap

Brokers can be stopped, killed (SIGKILL), frozen (SIGSTOP) and restarted on the same ports and data
to test failover; :meth:`KafkaCluster.leader` says which broker leads a partition.

``security=KafkaSecurity()`` makes the clients' listener SASL_SSL (or SSL, or SASL_PLAINTEXT) with
SCRAM users and a certificate signed by a CA made at start (:mod:`mqd.testing.certificates`)::

    with KafkaCluster(tmp_path, security=KafkaSecurity(users={"alice": "alice-secret"})) as kafka:
        kafka.create_topic("events", 3)  # the cluster's own admin: the PLAINTEXT listener
        producer = confluent_kafka.Producer(kafka.client_config("alice"))  # SASL_SSL, SCRAM-SHA-512
        mqd_settings = {"kafka": kafka.mqd_kafka_settings("alice")}  # [consumer.kafka] of a daemon

Start-up, measured on a 2-core machine with other work on it: one broker in 1.8 s (storage format
0.5 s, JVM to ready 1.2 s), three in 3.7 s; the JVM runs with C1 only, the serial GC and a class-data
archive of Kafka's classes (``<mqd cache>/maven/cds``, ~50 MB, written by the first broker that stops
cleanly and reused by every later JVM of the same Java and jars).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mqd.testing.certificates import DEFAULT_HOSTS, Certificates, generate_certificates
from mqd.testing.cluster import free_port
from mqd.testing.process import STOP_TIMEOUT, ManagedProcess
from mqd.waiting import wait_until_sync

# mqd.testing.maven is imported where it is used, not here: the package imports this module, and
# `python -m mqd.testing.maven` must not find its module imported before it runs (runpy warns)

# The newest Apache Kafka that Maven Central serves (4.0.0 ... 4.4.0); it resolves and starts here.
KAFKA_VERSION = "4.4.0"
START_TIMEOUT = 60.0  # a first start on a loaded 2-core machine; a warm one takes ~1-3 s
FORMAT_TIMEOUT = 60.0
STOP_GRACE = 3.0  # a broker closes its logs within ~0.5 s of SIGTERM

# Measured on the 2-core test machine, one broker, JVM start to ready (median of 4): 1.71 s with
# -Xmx512m (G1, C2), 1.55 s serial GC, 1.33 s serial GC + C1 only; under load 1.9 s without the
# class-data archive and 1.25 s with it. A test broker's start matters more than its steady speed.
JVM_FLAGS = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

# Kafka logs through slf4j 1.x onto log4j2, whose core its jars bring: the log goes to stdout, which
# the broker's ManagedProcess appends to root/broker-<i>/broker.log.
LOG4J2_PROPERTIES = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


def default_settings(brokers: int) -> dict[str, str]:
    """The server.properties every broker gets before ``settings``: internal topics replicated as far
    as the cluster allows, no group start-up delay, a dead broker fenced within seconds."""
    rf = "1" if brokers == 1 else "3" if brokers >= 3 else "2"
    return {
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": "1" if brokers == 1 else "2",
        "group.initial.rebalance.delay.ms": "0",
        # tests run groups with second-long sessions: Kafka's floor (6 s) would refuse them
        "group.min.session.timeout.ms": "500",
        # a killed broker is fenced (its partitions move) after 3 s, not Kafka's 9 s
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # topics come from create_topic(): a client's metadata request for a topic not made yet must
        # not create it with one partition behind the test's back
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
    }


SecurityProtocol = Literal["SASL_SSL", "SSL", "SASL_PLAINTEXT"]
ScramMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256"]
SCRAM_MECHANISMS: tuple[ScramMechanism, ...] = ("SCRAM-SHA-512", "SCRAM-SHA-256")
# kafka-storage's --add-scram parses "[name=...,password=...]": these characters cannot break it
_SCRAM_TEXT = re.compile(r"[A-Za-z0-9._~-]+")


def _default_users() -> dict[str, str]:
    return {"alice": secrets.token_urlsafe(12)}


@dataclass(frozen=True)
class KafkaSecurity:
    """How the clients' listener of a :class:`KafkaCluster` is secured; the brokers talk to each
    other and to their controllers over PLAINTEXT listeners on 127.0.0.1 all the same.

    - ``protocol``: ``SASL_SSL`` (default), ``SSL`` (TLS, no SASL) or ``SASL_PLAINTEXT``.
    - ``users``: SCRAM user name -> password, created with the storage (default: ``alice`` with a
      random password). Letters, digits and ``._~-`` only (kafka-storage's parser splits on others).
    - ``mechanisms``: which SCRAM mechanisms the listener offers and every user has credentials for;
      the first is what :meth:`KafkaCluster.client_config` picks.
    - ``hosts``: what the broker certificate names (TLS only): clients check it against the address
      they dialled, 127.0.0.1.
    """

    protocol: SecurityProtocol = "SASL_SSL"
    users: Mapping[str, str] = field(default_factory=_default_users, hash=False)
    mechanisms: tuple[ScramMechanism, ...] = SCRAM_MECHANISMS
    hosts: tuple[str, ...] = DEFAULT_HOSTS

    def __post_init__(self) -> None:
        if self.protocol not in ("SASL_SSL", "SSL", "SASL_PLAINTEXT"):
            raise ValueError(f"protocol must be SASL_SSL, SSL or SASL_PLAINTEXT (got {self.protocol!r})")
        object.__setattr__(self, "users", dict(self.users))  # the caller's dict may change later
        if self.sasl:
            if not self.users:
                raise ValueError(f"{self.protocol} needs at least one user")
            if not self.mechanisms or set(self.mechanisms) - set(SCRAM_MECHANISMS):
                raise ValueError(f"mechanisms must be some of {SCRAM_MECHANISMS} (got {self.mechanisms})")
        for name, password in self.users.items():
            if not (_SCRAM_TEXT.fullmatch(name) and _SCRAM_TEXT.fullmatch(password)):
                raise ValueError(f"user {name!r}: name and password take letters, digits and ._~- only")

    @property
    def tls(self) -> bool:
        """The clients' listener speaks TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        """The clients' listener asks for a SCRAM login."""
        return self.protocol.startswith("SASL_")


# the slf4j binding of each pinned release (derived by kafka_coordinates for any other), so that
# `python -m mqd.testing.maven <these two>` at install fills exactly the classpath a cluster reads
LOG_BINDINGS = {"4.4.0": "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5"}


def kafka_coordinates(version: str = KAFKA_VERSION) -> list[str]:
    """Kafka's broker artifact and the slf4j binding onto the log4j2 its jars bring, at the same
    log4j version (slf4j 1.x: ``log4j-slf4j-impl``, 2.x: ``log4j-slf4j2-impl``)."""
    from mqd.testing.maven import resolve

    kafka = f"org.apache.kafka:kafka_2.13:{version}"
    if version in LOG_BINDINGS:
        return [kafka, LOG_BINDINGS[version]]
    jars = [p.name for p in resolve([kafka])]
    log4j = _jar_version(jars, "log4j-core")
    slf4j = _jar_version(jars, "slf4j-api")
    binding = "log4j-slf4j-impl" if slf4j.startswith("1.") else "log4j-slf4j2-impl"
    return [kafka, f"org.apache.logging.log4j:{binding}:{log4j}"]


def _jar_version(names: list[str], artifact: str) -> str:
    for name in names:
        m = re.fullmatch(rf"{re.escape(artifact)}-(\d[\w.-]*)\.jar", name)
        if m:
            return m.group(1)
    raise ValueError(f"Kafka's runtime jars have no {artifact}: {names}")


def kafka_classpath(version: str = KAFKA_VERSION) -> list[Path]:
    """The jars a Kafka ``version`` broker runs on (resolved once, then read from mqd's cache)."""
    from mqd.testing.maven import resolve

    return resolve(kafka_coordinates(version))


def new_cluster_id() -> str:
    """A KRaft cluster id as Kafka's tools make one: 16 random bytes, URL-safe base64, no padding,
    never starting with "-" (a command line would read it as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def properties(settings: Mapping[str, str]) -> str:
    """``key=value`` lines of a Java properties file (values escaped where Java would misread them)."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{esc(k)}={esc(v)}\n" for k, v in settings.items())


def api_versions(port: int, timeout: float = 2.0) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 to the broker on 127.0.0.1:``port``: api key -> (min, max) version it serves.
    OSError when it does not answer (a Kafka broker accepts connections only once it is started)."""
    request = struct.pack(">hhih", 18, 0, 1, 3) + b"mqd"  # ApiVersions v0, correlation 1, client "mqd"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read_exact(s, 4))[0]
        body = _read_exact(s, size)
    correlation, error, count = struct.unpack_from(">ihi", body)
    if correlation != 1 or error != 0:
        raise OSError(f"ApiVersions answered correlation {correlation}, error {error}")
    out: dict[int, tuple[int, int]] = {}
    for i in range(count):
        key, lo, hi = struct.unpack_from(">hhh", body, 10 + 6 * i)
        out[key] = (lo, hi)
    return out


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


class KafkaNode(ManagedProcess):
    """One broker (a controller voter too when it has a ``controller_port``): its ports, folder and
    (while running) its JVM. ``port`` is the clients' listener; with security the brokers and the
    cluster's own admin use a PLAINTEXT one on ``internal_port``."""

    def __init__(
        self, index: int, root: Path, port: int, controller_port: int | None, internal_port: int | None = None
    ) -> None:
        self.index = index
        self.port = port
        self.controller_port = controller_port
        self.internal_port = internal_port
        self.dir = root / f"broker-{index}"
        self.config_path = self.dir / "server.properties"
        self.data_dir = self.dir / "data"
        super().__init__(f"kafka-{index}", [], self.dir / "broker.log", cwd=self.dir, die_with_parent=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def plaintext_port(self) -> int:
        """The PLAINTEXT listener's port: the internal one under security, else the clients' one."""
        return self.internal_port or self.port


class KafkaCluster:
    """Apache Kafka brokers (KRaft, combined broker + controller nodes) on 127.0.0.1. Use it as a
    context manager or call :meth:`start` and, in a finalizer, :meth:`stop`.

    - ``brokers``: how many (broker ``i`` has node id ``i``).
    - ``controllers``: how many of them (the first ones) are controller voters too (default: all).
      Fewer voters than brokers keeps the quorum up while other brokers are down, frozen or killed
      (three voters lose it with two of them gone).
    - ``settings``: server.properties for every broker, over :func:`default_settings` (e.g.
      ``replica.selector.class``, ``unclean.leader.election.enable``).
    - ``broker_settings``: broker index -> settings for that broker only (e.g. ``broker.rack``).
    - ``version``: the Kafka release (Maven Central's ``org.apache.kafka:kafka_2.13``).
    - ``security``: a :class:`KafkaSecurity` secures the clients' listener (``bootstrap``): SASL_SSL
      with SCRAM-SHA-512 and -256 users by default. The CA and the broker certificate (for
      localhost and 127.0.0.1, PEM) are made by the first :meth:`start` under ``root/tls/``
      (:attr:`ca_file`; :attr:`certificates` has the rest), the users are created when the storage
      is formatted (:attr:`users`). :meth:`client_config` is a confluent-kafka config that logs in,
      :meth:`mqd_kafka_settings` the ``[consumer.kafka]`` settings of an mqd daemon that does.
      The brokers, their controllers and :meth:`admin` stay on PLAINTEXT listeners on 127.0.0.1
      (``plaintext_bootstrap``), so topics and waits work whatever a test does to the credentials.
      Costs one keytool pair of JVMs at the first start, beside the storage format.

    The constructor only picks ports; :meth:`start` resolves the jars, writes the configs, formats
    each broker's storage (once: a restarted cluster keeps its data) and starts the JVMs.
    """

    def __init__(
        self,
        root: Path,
        brokers: int = 1,
        *,
        controllers: int | None = None,
        settings: Mapping[str, str] | None = None,
        broker_settings: Mapping[int, Mapping[str, str]] | None = None,
        version: str = KAFKA_VERSION,
        jvm_flags: tuple[str, ...] = JVM_FLAGS,
        security: KafkaSecurity | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("a Kafka cluster needs at least one broker")
        voters = brokers if controllers is None else controllers
        if not 1 <= voters <= brokers:
            raise ValueError(f"controllers must be in 1..{brokers} (got {controllers})")
        unknown = set(broker_settings or {}) - set(range(brokers))
        if unknown:
            raise ValueError(f"broker_settings for unknown brokers: {sorted(unknown)}")
        self.root = Path(root)
        self.version = version
        self.jvm_flags = tuple(jvm_flags)
        self.security = security
        self.brokers = [
            KafkaNode(
                i,
                self.root,
                free_port(),
                free_port() if i < voters else None,
                free_port() if security is not None else None,
            )
            for i in range(brokers)
        ]
        self.settings = {**default_settings(brokers), **(settings or {})}
        self.broker_settings = {i: dict(s) for i, s in (broker_settings or {}).items()}
        self.cluster_id = new_cluster_id()
        self.bootstrap = ",".join(b.address for b in self.brokers)
        # what the cluster's own admin uses: the same as bootstrap without security
        self.plaintext_bootstrap = ",".join(f"127.0.0.1:{b.plaintext_port}" for b in self.brokers)
        self.certificates: Certificates | None = None  # TLS: made by the first start()
        self._key_password = secrets.token_urlsafe(18)
        self._admin: Any = None
        self._classpath: list[Path] = []
        self._java_path = "java"  # $JAVA_HOME/bin/java or the one on PATH, found by start()
        self._archive: Path | None = None  # the class-data archive the JVMs share
        self._dumping: dict[int, Path] = {}  # broker index -> the archive its JVM writes at exit

    # -- config ------------------------------------------------------------------------------------

    def server_properties(self, i: int) -> dict[str, str]:
        """Everything broker ``i``'s server.properties says."""
        b = self.brokers[i]
        voters = ",".join(
            f"{x.index}@127.0.0.1:{x.controller_port}" for x in self.brokers if x.controller_port
        )
        # a listener is named after its protocol: a client's metadata answer lists the addresses
        # of the listener it asked on, so secured clients never see the PLAINTEXT ones
        advertised = [f"PLAINTEXT://127.0.0.1:{b.plaintext_port}"]
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
        sec = self.security
        if sec is not None:
            advertised.insert(0, f"{sec.protocol}://127.0.0.1:{b.port}")
            protocols[sec.protocol] = sec.protocol
        listeners = list(advertised)
        if b.controller_port:
            listeners.append(f"CONTROLLER://127.0.0.1:{b.controller_port}")
        return {
            "process.roles": "broker,controller" if b.controller_port else "broker",
            "node.id": str(i),
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(b.data_dir),
            **self._security_properties(),
            **self.settings,
            **self.broker_settings.get(i, {}),
        }

    def _tls_dir(self) -> Path:
        return self.root / "tls"

    def _security_properties(self) -> dict[str, str]:
        sec = self.security
        if sec is None:
            return {}
        out: dict[str, str] = {}
        if sec.tls:
            # Kafka 2.7+ reads a PEM file holding the encrypted PKCS#8 key and the chain (KIP-651):
            # no JKS or PKCS#12 keystore to build, so keytool runs twice, not five times
            out["ssl.keystore.type"] = "PEM"
            out["ssl.keystore.location"] = str(self._tls_dir() / "server.pem")
            out["ssl.key.password"] = self._key_password
        if sec.sasl:
            out["sasl.enabled.mechanisms"] = ",".join(sec.mechanisms)
            listener = sec.protocol.lower()
            for mechanism in sec.mechanisms:
                # a SASL listener needs a login context per mechanism even when it only serves
                # (the credentials it checks are the SCRAM records in the metadata)
                key = f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"
                out[key] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return out

    def _java(self, main: str, *args: str, archive: list[str]) -> list[str]:
        cp = os.pathsep.join(map(str, self._classpath))
        log4j = f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}"
        return [self._java_path, *self.jvm_flags, *archive, log4j, "-cp", cp, main, *args]

    # -- class-data archive --------------------------------------------------------------------------

    def _archive_path(self) -> Path:
        """One archive per JVM build, JVM flags (the GC is part of it) and classpath: a JVM ignores
        an archive made otherwise, with a warning."""
        from mqd.testing.maven import maven_dir

        java = Path(self._java_path).resolve()
        st = java.stat()
        parts = [str(java), str(st.st_size), str(st.st_mtime_ns), *self.jvm_flags, *map(str, self._classpath)]
        key = "\n".join(parts)
        return (
            maven_dir() / "cds" / f"kafka-{self.version}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"
        )

    def _archive_flags(self, i: int) -> list[str]:
        assert self._archive is not None
        if self._archive.is_file():
            return [f"-XX:SharedArchiveFile={self._archive}"]
        if self._dumping:  # one broker writes it, the others start without one
            return []
        tmp = self._archive.with_name(f".{self._archive.name}.{os.getpid()}.{i}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        self._dumping[i] = tmp
        # -Xlog: the dump's hundreds of "skipping class" warnings would bury the broker's log
        return [f"-XX:ArchiveClassesAtExit={tmp}", "-Xlog:cds=off,cds+dynamic=off"]

    def _archive_done(self, i: int) -> None:
        """After broker ``i`` exited: keep the archive its JVM wrote at a clean exit, if it did."""
        tmp = self._dumping.pop(i, None)
        if tmp is None or self._archive is None:
            return
        b = self.brokers[i]
        # the JVM writes it on its way out after SIGTERM (exit 143); a SIGKILLed one's file is partial
        clean = b.returncode in (0, 128 + signal.SIGTERM)
        if clean and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, self._archive)
        else:
            tmp.unlink(missing_ok=True)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> KafkaCluster:
        """Resolve the jars, write the configs, format new storage, start every broker and wait until
        each answers and the metadata lists them all; returns the cluster."""
        from mqd.testing.maven import java_binary

        self._java_path = java_binary()
        self._classpath = kafka_classpath(self.version)
        self._archive = self._archive_path()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        for b in self.brokers:
            b.dir.mkdir(parents=True, exist_ok=True)
            b.config_path.write_text(properties(self.server_properties(b.index)))
        unformatted = [b for b in self.brokers if not (b.data_dir / "meta.properties").exists()]
        if self.security is not None and self.security.tls and self.certificates is None:
            # keytool's two JVMs run while the storage format's JVMs do: they need nothing of each other
            with ThreadPoolExecutor(1, thread_name_prefix="keytool") as pool:
                made: Future[Certificates] = pool.submit(
                    generate_certificates,
                    self._tls_dir(),
                    self.security.hosts,
                    java=self._java_path,
                    password=self._key_password,
                )
                try:
                    self._format(unformatted)
                finally:
                    self.certificates = made.result()
        else:
            self._format(unformatted)
        try:
            for b in self.brokers:
                self._launch(b.index)
            for b in self.brokers:
                self.wait_broker_ready(b.index, timeout)
            self.wait_registered(timeout=timeout)
        except BaseException:
            self.stop()  # a `with` block whose start failed never reaches __exit__
            raise
        return self

    def _format(self, brokers: list[KafkaNode]) -> None:
        """kafka-storage format for each of ``brokers``, side by side (one JVM each)."""
        archive = (
            [f"-XX:SharedArchiveFile={self._archive}"] if self._archive and self._archive.is_file() else []
        )
        running = []
        for b in brokers:
            argv = self._java(
                "kafka.tools.StorageTool",
                "format",
                "--config",
                str(b.config_path),
                "--cluster-id",
                self.cluster_id,
                "--ignore-formatted",
                *self._scram_arguments(),
                archive=archive,
            )
            log = open(b.dir / "format.log", "wb")  # closed below, once the JVM is done
            running.append((b, log, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)))
        for b, log, proc in running:
            try:
                rc = proc.wait(FORMAT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                rc = -9
            finally:
                log.close()
            if rc != 0:
                tail = (b.dir / "format.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"formatting kafka-{b.index}'s storage failed ({rc}):\n{tail}")

    def _scram_arguments(self) -> list[str]:
        sec = self.security
        if sec is None or not sec.sasl:
            return []
        out = []
        for name, password in sec.users.items():
            for mechanism in sec.mechanisms:
                out += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return out

    def _launch(self, i: int) -> None:
        b = self.brokers[i]
        b.argv = self._java("kafka.Kafka", str(b.config_path), archive=self._archive_flags(i))
        b.start()

    def _answers(self, i: int) -> bool:
        try:
            api_versions(self.brokers[i].plaintext_port, timeout=1.0)
        except OSError:
            return False
        return True

    def wait_broker_ready(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Until broker ``i`` answers requests (it opens its port to clients once it has caught up
        with the metadata and is unfenced): ProcessError if it exits first, TimeoutError after."""
        self.brokers[i].wait_ready(lambda: self._answers(i), timeout, interval=0.05)

    def wait_registered(self, brokers: list[int] | None = None, timeout: float = START_TIMEOUT) -> None:
        """Until the cluster's metadata lists ``brokers`` (default: every running one)."""
        want = set(brokers if brokers is not None else [b.index for b in self.brokers if b.running])

        def listed() -> bool:
            md = self._metadata(timeout=1.0)
            return md is not None and want <= set(md.brokers)

        wait_until_sync(listed, timeout, f"brokers {sorted(want)} in the metadata", interval=0.05)

    def stop_broker(self, i: int, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (Kafka's controlled shutdown moves its leaders away first), SIGKILL after
        ``timeout``; the exit code."""
        rc = self.brokers[i].stop(signal.SIGTERM, timeout)
        self._archive_done(i)
        return rc

    def kill_broker(self, i: int) -> int | None:
        """SIGKILL: no controlled shutdown; the controller fences it after broker.session.timeout.ms."""
        rc = self.brokers[i].stop(signal.SIGKILL, STOP_TIMEOUT)
        self._archive_done(i)
        return rc

    def freeze_broker(self, i: int) -> None:
        """SIGSTOP: the broker's connections stay open and nothing answers."""
        self.brokers[i].send_signal(signal.SIGSTOP)

    def thaw_broker(self, i: int) -> None:
        """SIGCONT after :meth:`freeze_broker`."""
        self.brokers[i].send_signal(signal.SIGCONT)

    def start_broker(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Start broker ``i`` again (same ports, same data) and wait until it answers and is listed."""
        self._launch(i)
        self.wait_broker_ready(i, timeout)
        self.wait_registered([i], timeout)

    def restart_broker(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """:meth:`stop_broker` (when it runs) and :meth:`start_broker`."""
        if self.brokers[i].running:
            self.stop_broker(i)
        self.start_broker(i, timeout)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop every broker: SIGTERM to all at once, SIGKILL whatever runs after ``grace`` seconds
        (with three voters stopping together, each waits 5 s for a quorum that is leaving, after its
        logs are closed). Idempotent."""
        stopping = [b for b in self.brokers if b.begin_stop(signal.SIGTERM)]
        # a JVM writing the class-data archive does so on its way out: give it the time
        deadline = time.monotonic() + (STOP_TIMEOUT if self._dumping else grace)
        for b in stopping:
            try:
                b.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                b.stop(signal.SIGKILL, STOP_TIMEOUT)
        for b in self.brokers:
            self._archive_done(b.index)
        self._admin = None

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- admin -------------------------------------------------------------------------------------

    def admin(self) -> Any:
        """confluent-kafka's AdminClient on this cluster (made once; dev extra)."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            # log_level 2: librdkafka's connection-refused lines would flood a test's output whenever
            # a broker is down on purpose; failures still arrive as exceptions
            self._admin = AdminClient({"bootstrap.servers": self.plaintext_bootstrap, "log_level": 2})
        return self._admin

    # -- security ----------------------------------------------------------------------------------

    @property
    def users(self) -> dict[str, str]:
        """SCRAM user name -> password (empty without SASL)."""
        sec = self.security
        return dict(sec.users) if sec is not None and sec.sasl else {}

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate (PEM) that signed the brokers' certificate: a client's trust store
        (None without TLS, or before the first :meth:`start`)."""
        return self.certificates.ca_file if self.certificates is not None else None

    def _login(self, user: str | None, mechanism: str | None) -> tuple[str, str, str]:
        sec = self.security
        assert sec is not None and sec.sasl
        name = user if user is not None else next(iter(sec.users))
        if name not in sec.users:
            raise KeyError(f"no SCRAM user {name!r} in this cluster (users: {sorted(sec.users)})")
        return name, sec.users[name], mechanism or sec.mechanisms[0]

    def client_config(
        self, user: str | None = None, *, mechanism: str | None = None, password: str | None = None
    ) -> dict[str, str]:
        """A confluent-kafka (librdkafka) config reaching :attr:`bootstrap` as ``user`` (default: the
        first one) with ``mechanism`` (default: the first offered); ``password`` replaces the user's
        (a test of a wrong one). Add the producer's or consumer's own settings to it."""
        out = {"bootstrap.servers": self.bootstrap}
        sec = self.security
        if sec is None:
            return out
        out["security.protocol"] = sec.protocol
        if sec.tls:
            if self.ca_file is None:
                raise RuntimeError("the cluster's certificates are made by start(): start it first")
            out["ssl.ca.location"] = str(self.ca_file)
        if sec.sasl:
            name, real, mech = self._login(user, mechanism)
            out |= {"sasl.mechanism": mech, "sasl.username": name, "sasl.password": password or real}
        return out

    def mqd_kafka_settings(
        self, user: str | None = None, *, mechanism: str | None = None, password: str | None = None
    ) -> dict[str, str]:
        """The ``[consumer.kafka]`` settings of an mqd daemon reading this cluster as ``user`` (see
        :meth:`client_config`; TOML-ready strings, also what ``ConsumerConfig(kafka=...)`` takes)."""
        sec = self.security
        if sec is None:
            return {}
        out: dict[str, str] = {"security_protocol": sec.protocol}
        if sec.tls:
            if self.ca_file is None:
                raise RuntimeError("the cluster's certificates are made by start(): start it first")
            out["tls_ca_file"] = str(self.ca_file)
        if sec.sasl:
            name, real, mech = self._login(user, mechanism)
            out |= {"sasl_mechanism": mech, "sasl_username": name, "sasl_password": password or real}
        return out

    def _metadata(self, topic: str | None = None, timeout: float = 5.0) -> Any:
        from confluent_kafka import KafkaException

        try:
            return self.admin().list_topics(topic, timeout=timeout)
        except KafkaException:
            return None

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create ``name`` and wait until every partition has a leader in the metadata."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        new = NewTopic(
            name, num_partitions=partitions, replication_factor=replication_factor, config=dict(config or {})
        )
        for fut in self.admin().create_topics([new], operation_timeout=timeout).values():
            fut.result(timeout)

        def led() -> bool:
            md = self._metadata(name, timeout=1.0)
            t = md.topics.get(name) if md is not None else None
            return (
                t is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            )

        wait_until_sync(led, timeout, f"every partition of {name} to have a leader", interval=0.05)

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        """Delete ``name`` and wait until the metadata no longer lists it."""
        for fut in self.admin().delete_topics([name], operation_timeout=timeout).values():
            fut.result(timeout)

        def gone() -> bool:
            md = self._metadata(timeout=1.0)
            return md is not None and name not in md.topics

        wait_until_sync(gone, timeout, f"{name} to be deleted", interval=0.05)

    def leader(self, topic: str, partition: int, timeout: float = 5.0) -> int | None:
        """The index of the broker leading ``partition`` of ``topic`` (None: no leader right now)."""
        md = self._metadata(topic, timeout)
        t = md.topics.get(topic) if md is not None else None
        p = t.partitions.get(partition) if t is not None else None
        return p.leader if p is not None and p.leader >= 0 else None

    def in_sync_replicas(self, topic: str, partition: int, timeout: float = 5.0) -> list[int] | None:
        """The broker indexes in ``partition``'s ISR (None: the metadata did not answer or has no
        such partition)."""
        md = self._metadata(topic, timeout)
        t = md.topics.get(topic) if md is not None else None
        p = t.partitions.get(partition) if t is not None else None
        return sorted(p.isrs) if p is not None else None

    def api_versions(self, i: int = 0) -> dict[int, tuple[int, int]]:
        """What broker ``i`` answers to ApiVersions: api key -> (min, max) version (asked on its
        PLAINTEXT listener)."""
        return api_versions(self.brokers[i].plaintext_port)

    # -- logs --------------------------------------------------------------------------------------

    def log(self, i: int) -> str:
        """Everything broker ``i`` wrote to its log so far."""
        p = self.brokers[i].log_path
        return p.read_text(errors="replace") if p.exists() else ""

    def dump_logs(self, tail: int = 60) -> str:
        """The last ``tail`` lines of every broker's log, for a failing test's output."""
        out = []
        for b in self.brokers:
            lines = self.log(b.index).splitlines()[-tail:]
            out.append(f"----- kafka-{b.index} ({b.log_path}) -----\n" + "\n".join(lines))
        return "\n".join(out)
