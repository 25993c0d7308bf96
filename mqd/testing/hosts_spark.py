"""A Spark standalone cluster across hosts of a :class:`~mqd.testing.hosts_net.HostNetwork`.

:class:`HostSpark` starts Spark's own standalone master (``org.apache.spark.deploy.master.Master``,
from the pyspark installation's ``spark-class``) on one host and a worker
(``org.apache.spark.deploy.worker.Worker``) on each worker host, each bound to its host's bridge
address, and runs ``mqd spark`` as the driver on the master's host against ``spark://<master>:7077``
(:meth:`HostSpark.driver`): the executors run on the worker hosts, across the bridge, where the
hosts' faults apply (kill a worker host mid-batch: its executor dies with it).

The table's folder is a path of this machine, which every host sees (one file system, as a shared
mount would be); the landing is read through S3 on its own host. A worker's processes get the
environment it is given (the AWS variables of the landing's store, the Python that runs the job's
Python side).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from mqd.testing.hosts_net import NetHost
from mqd.testing.process import ManagedProcess
from mqd.waiting import wait_until_sync

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
START_TIMEOUT = 90.0


def spark_class() -> str:
    """pyspark's ``spark-class`` (the launcher of Spark's JVM main classes)."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


class HostSpark:
    """A master on ``master`` (also the driver's host) and one worker per host in ``workers``, each
    offering ``worker_cores`` cores and ``worker_memory`` to executors. ``env``: over ours for
    every process (credentials of the landing's store)."""

    def __init__(
        self,
        root: Path,
        master: NetHost,
        workers: list[NetHost],
        *,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.master_host = master
        self.worker_hosts = list(workers)
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.extra_env = dict(env or {})
        self.master: ManagedProcess | None = None
        self.workers: list[ManagedProcess] = []

    @property
    def url(self) -> str:
        return f"spark://{self.master_host.address}:{MASTER_PORT}"

    def env(self, host: NetHost) -> dict[str, str]:
        """A process's environment on ``host``: Spark binds and advertises the host's address."""
        import pyspark

        return {
            **os.environ,
            **self.extra_env,
            "SPARK_HOME": str(Path(pyspark.__file__).parent),
            "SPARK_LOCAL_IP": host.address,
            "SPARK_LOCAL_HOSTNAME": host.address,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_WORKER_DIR": str(self.root / f"work-{host.name}"),
            # executors' scratch (and their copies of the application's jars, 683 MB) inside the
            # rig's folder: a killed worker's executor never deletes it, and /tmp is shared
            "SPARK_LOCAL_DIRS": str(self.root / f"local-{host.name}"),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def start(self) -> None:
        """Start the master and the workers; wait until the master lists every worker ALIVE."""
        self.root.mkdir(parents=True, exist_ok=True)
        h = self.master_host
        self.master = h.process(
            "spark-master",
            [
                spark_class(),
                "org.apache.spark.deploy.master.Master",
                "--host",
                h.address,
                "--port",
                str(MASTER_PORT),
                "--webui-port",
                str(MASTER_UI_PORT),
            ],
            self.root / "master.log",
            cwd=self.root,
            env=self.env(h),
        )
        self.master.start()
        self.master.wait_ready(lambda: self.status() is not None, START_TIMEOUT, interval=0.2)
        for w in self.worker_hosts:
            proc = w.process(
                f"spark-worker-{w.name}",
                [
                    spark_class(),
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    w.address,
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--webui-port",
                    str(WORKER_UI_PORT),
                    self.url,
                ],
                self.root / f"worker-{w.name}.log",
                cwd=self.root,
                env=self.env(w),
            )
            self.workers.append(proc)
            proc.start()
        self.wait_workers(len(self.worker_hosts))

    def status(self) -> dict[str, object] | None:
        """The master's ``/json`` answer (workers, applications), None when it does not answer."""
        url = f"http://{self.master_host.address}:{MASTER_UI_PORT}/json"
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                out: dict[str, object] = json.loads(r.read())
                return out
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[str]:
        """The hosts (addresses) of the workers the master lists ALIVE."""
        s = self.status() or {}
        workers = s.get("workers", [])
        assert isinstance(workers, list)
        return [str(w.get("host")) for w in workers if w.get("state") == "ALIVE"]

    def wait_workers(self, n: int, timeout: float = START_TIMEOUT) -> None:
        """Until the master lists ``n`` workers ALIVE."""
        wait_until_sync(
            lambda: len(self.alive_workers()) >= n, timeout, f"{n} Spark workers alive", interval=0.2
        )

    def restart_worker(self, i: int) -> None:
        """Start worker ``i`` again (after its host was killed) and wait until it is back."""
        if not self.workers[i].running:
            self.workers[i].start()
        want = self.worker_hosts[i].address
        wait_until_sync(
            lambda: want in self.alive_workers(), START_TIMEOUT, f"worker {want} back", interval=0.2
        )

    def driver(self, argv: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> ManagedProcess:
        """A process on the master's host (not started) with Spark's environment for that host:
        ``mqd spark`` as the driver, e.g. ``[python, -m, mqd.operator.cli, spark, --config, ..., --master,
        hs.url]``."""
        return self.master_host.process(
            "spark-driver", argv, log_path, cwd=self.root, env={**self.env(self.master_host), **(env or {})}
        )

    def stop(self) -> None:
        for w in self.workers:
            w.kill_now()
        if self.master is not None:
            self.master.kill_now()

    def dump_logs(self, tail: int = 40) -> str:
        procs = [p for p in [self.master, *self.workers] if p is not None]
        return "\n".join(f"--- {p.name} ---\n{p.tail(tail)}" for p in procs)
