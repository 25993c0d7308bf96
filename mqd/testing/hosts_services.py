"""Kafka brokers and SeaweedFS, each on a host of a :class:`~mqd.testing.hosts_net.HostNetwork`.

:class:`HostKafkaCluster` is :class:`~mqd.testing.kafka_cluster.KafkaCluster` (same jars, storage,
JVM flags, admin and waits) with broker ``i`` inside host ``hosts[i]``: it listens on all of the
host's addresses (``9092`` for clients and brokers, ``9093`` for the controller quorum; every broker
is a voter) and advertises the host's bridge address, so every client, the other brokers and the
test process reach it across the bridge, where the host's faults apply. :class:`HostSeaweedFS` is
:class:`~mqd.testing.seaweedfs.SeaweedFS`'s ``weed mini`` inside one host, S3 on
``s3_port``.
"""

from __future__ import annotations

import socket
from pathlib import Path

from mqd.testing.cluster import free_port
from mqd.testing.hosts_net import NetHost
from mqd.testing.kafka_cluster import JVM_FLAGS, KafkaCluster
from mqd.testing.process import ManagedProcess
from mqd.testing.seaweedfs import SeaweedFS

KAFKA_PORT = 9092
CONTROLLER_PORT = 9093


def answers_tcp(address: str, port: int, timeout: float = 1.0) -> bool:
    """True when ``address:port`` accepts a TCP connection (a Kafka broker opens its client port
    only once it has caught up with the metadata and is unfenced)."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


class HostKafkaCluster(KafkaCluster):
    """One broker per host in ``hosts`` (combined broker + controller nodes; no TLS/SASL here).
    ``settings``: server.properties over the defaults, ``jvm_flags`` (a larger ``-Xmx`` for
    thousands of partitions), as for :class:`KafkaCluster`."""

    def __init__(
        self,
        root: Path,
        hosts: list[NetHost],
        *,
        settings: dict[str, str] | None = None,
        jvm_flags: tuple[str, ...] = JVM_FLAGS,
    ) -> None:
        super().__init__(root, len(hosts), settings=settings, jvm_flags=jvm_flags)
        self.hosts = list(hosts)
        for b, h in zip(self.brokers, self.hosts, strict=True):
            b.port = KAFKA_PORT
            b.controller_port = CONTROLLER_PORT
            h.processes.append(b)  # the host's kill/freeze reach its broker
        self.bootstrap = ",".join(f"{h.address}:{KAFKA_PORT}" for h in self.hosts)
        self.plaintext_bootstrap = self.bootstrap

    def server_properties(self, i: int) -> dict[str, str]:
        h = self.hosts[i]
        return {
            **super().server_properties(i),
            "controller.quorum.voters": ",".join(
                f"{j}@{x.address}:{CONTROLLER_PORT}" for j, x in enumerate(self.hosts)
            ),
            "listeners": f"PLAINTEXT://0.0.0.0:{KAFKA_PORT},CONTROLLER://0.0.0.0:{CONTROLLER_PORT}",
            "advertised.listeners": f"PLAINTEXT://{h.address}:{KAFKA_PORT}",
        }

    def _launch(self, i: int) -> None:
        b = self.brokers[i]
        java = self._java("kafka.Kafka", str(b.config_path), archive=self._archive_flags(i))
        b.argv = ["ip", "netns", "exec", self.hosts[i].netns, *java]
        b.start()

    def _answers(self, i: int) -> bool:
        return answers_tcp(self.hosts[i].address, KAFKA_PORT)

    def host_of(self, i: int) -> NetHost:
        return self.hosts[i]


class HostSeaweedFS(SeaweedFS):
    """``weed mini`` (master, volume, filer, S3) inside ``host``; S3 at ``http://<host>:<s3_port>``."""

    def __init__(self, root: Path, host: NetHost, *, bucket: str = "landing") -> None:
        super().__init__(root, bucket=bucket)  # picks the filer's ports (free on this machine)
        self.host = host
        self.s3_port = free_port()

    def start(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        # ports free on this machine, not fixed ones, though the host has a network of its own:
        # weed names its gRPC unix sockets after them (/tmp/seaweedfs-<role>-grpc-<port>.sock), and
        # the file system is shared, so two rigs on fixed ports would talk to each other's servers
        argv = self._mini_argv(data, self.s3_port, ip=self.host.address, bind="0.0.0.0")
        proc = self.host.process("weed-mini", argv, self._log_dir() / "mini.out")
        self._procs.append(proc)
        proc.start()
        self.endpoints.append(f"http://{self.host.address}:{self.s3_port}")
        self._wait_s3(proc, self.endpoint)
        self.client().create_bucket(Bucket=self.bucket)

    def restart(self) -> None:
        """Start ``weed mini`` again on its data (after the host's processes were killed)."""
        proc: ManagedProcess = self._procs[0]
        if not proc.running:
            proc.start()
        self._wait_s3(proc, self.endpoint)
