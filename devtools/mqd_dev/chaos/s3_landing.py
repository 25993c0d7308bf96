"""The object-store landing of a chaos run (``--landing s3``): SeaweedFS on 127.0.0.1, two gateways.

:class:`S3Landing` starts a SeaweedFS (mqd.testing.seaweedfs: ``weed mini`` with telemetry off and
every listener on 127.0.0.1) plus a second ``weed s3`` gateway on the same filer, so the daemons
publish through different gateways ("two machines" writing one store): daemon ``i`` is configured
with gateway ``i % 2``. The chaos process itself reads the landing only through gateway 0 (the
``weed mini``), which no fault touches, and only through the store (``LandingStore``: heads,
manifest, visible files), as the Spark job does.

The S3-only fault kinds act on gateway 1, the one the odd daemons publish through:
``gateway_freeze`` SIGSTOPs it for the hold (requests hang mid-publication, then go on), and
``gateway_kill`` SIGKILLs it and starts it again on the same port after the hold (requests fail;
the publishers' retries and the claim chain must sort it out).
"""

from __future__ import annotations

import io
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mqd.landing.s3_objects import S3Objects
from mqd.landing.store import LandingStore
from mqd.testing.process import ManagedProcess
from mqd.testing.seaweedfs import REGION, SeaweedFS
from mqd_dev.chaos.check import COPY_COLUMNS, COPY_SCHEMA

# the landing kinds that need a local directory (a tmpfs, a read-only mount, /proc/locks)
NOT_ON_S3: tuple[str, ...] = ("landing_readonly", "landing_full", "lock_freeze")


class ChaosSeaweedFS(SeaweedFS):
    """SeaweedFS whose gateways the chaos run can restart."""

    def restart_gateway(self, n: int) -> None:
        """Start the stopped gateway ``n`` again (same argv, same port); wait until it answers."""
        proc = self.gateway(n)
        if not proc.running:
            proc.start()
            self._wait_s3(proc, self.endpoints[n])


class S3Landing:
    """Build in __init__; ``start()`` runs SeaweedFS (blocking, up to a minute); ``stop()`` idempotent."""

    def __init__(self, root: Path, *, gateways: int = 2) -> None:
        self.server = ChaosSeaweedFS(root / "seaweedfs", bucket="landing")
        self.gateways = gateways
        self.uri = f"s3://{self.server.bucket}/chaos"
        self._store: LandingStore | None = None

    def start(self) -> None:
        self.server.start()
        for _ in range(self.gateways - 1):
            self.server.add_gateway()
        self._store = LandingStore(S3Objects(self.uri, client=self.server.client(self.server.endpoint)))

    def stop(self) -> None:
        self.server.stop()

    @property
    def store(self) -> LandingStore:
        if self._store is None:
            raise RuntimeError("S3Landing.start() first")
        return self._store

    def endpoint_for(self, index: int) -> str:
        """The gateway daemon number ``index`` publishes through."""
        return self.server.endpoints[index % len(self.server.endpoints)]

    def s3_section(self, index: int) -> dict[str, object]:
        """The daemon config's ``[landing.s3]`` table (its ``landing.dir`` is :attr:`uri`)."""
        return {"endpoint_url": self.endpoint_for(index), "region": REGION}

    def env(self) -> dict[str, str]:
        return self.server.env()

    @property
    def faulted_gateway(self) -> ManagedProcess:
        return self.server.gateway(len(self.server.endpoints) - 1)

    def freeze_gateway(self) -> None:
        self.faulted_gateway.send_signal(signal.SIGSTOP)

    def thaw_gateway(self) -> None:
        gw = self.faulted_gateway
        if gw.running:
            gw.send_signal(signal.SIGCONT)

    def kill_gateway(self) -> None:
        self.faulted_gateway.stop(signal.SIGKILL)

    def restart_gateway(self) -> None:
        """Start the killed gateway again (same argv, same port) and wait until it answers."""
        self.server.restart_gateway(len(self.server.endpoints) - 1)

    def summary(self) -> str:
        return (
            f"{self.uri} on SeaweedFS, gateways {self.server.endpoints} (daemon i publishes through "
            f"gateway i % {len(self.server.endpoints)}); not applicable on S3: {', '.join(NOT_ON_S3)}"
        )

    # -- the end check's view ------------------------------------------------------------------------

    def _topic_keys(self, topic: str) -> list[str]:
        return [k for k in self.store.visible_files() if k.startswith(f"topic={topic}/")]

    def _read(self, key: str, columns: list[str]) -> pa.Table:
        got = self.store.objects.get(key)
        if got is None:  # listed as visible, gone when read: the check must see it
            raise FileNotFoundError(f"{self.uri}/{key} listed as visible but absent")
        return pq.read_table(io.BytesIO(got[0]), columns=columns)

    def read_landing(self, topic: str) -> pa.Table:
        """Every row of the visible data files of ``topic`` (partition, offset, value)."""
        tables = [
            self._read(k, COPY_COLUMNS).select(COPY_COLUMNS).cast(COPY_SCHEMA)
            for k in self._topic_keys(topic)
        ]
        return pa.concat_tables(tables) if tables else COPY_SCHEMA.empty_table()

    def incarnations(self, topic: str) -> dict[int, list[str]]:
        out: dict[int, set[str]] = {}
        for key in self._topic_keys(topic):
            t = self._read(key, ["partition", "incarnation"])
            for p, inc in zip(
                t.column("partition").to_pylist(), t.column("incarnation").to_pylist(), strict=True
            ):
                out.setdefault(int(p), set()).add(str(inc))
        return {p: sorted(v) for p, v in sorted(out.items())}

    def manifest_vs_visible(self, topic: str) -> list[str]:
        """Problems between the manifest and the visible files (a visible file the manifest does not
        list, or a manifest entry with no visible file); empty when they agree."""
        listed = {r.path for r in self.store.manifest(topic)}
        visible = set(self._topic_keys(topic))
        out = [f"visible but not in the manifest: {k}" for k in sorted(visible - listed)[:5]]
        out += [f"in the manifest but not visible: {k}" for k in sorted(listed - visible)[:5]]
        return out
