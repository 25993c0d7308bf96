"""StorageNode: one broker Storage over a data dir of a single partition, reopenable like a restart.

For tests of mqd/broker/storage.py on real segment files (fenced ranges, incarnations): ``open()``
closes what is open and opens the data dir again, as a node's restart does. ``flip_byte`` is the
damage those tests (and the scrub and recovery ones) do to a segment.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mqd.broker.storage import PartitionLog, Storage
from mqd.config import StorageConfig

TOPIC = "events"


class StorageNode:
    """Partition ``events-0`` of a Storage in ``root`` (small segments, no fsync)."""

    def __init__(self, root: Path, **cfg: Any) -> None:
        self.root = root
        self.config = StorageConfig(segment_bytes=4096, fsync="never", **cfg)
        self.storage: Storage | None = None

    @property
    def folder(self) -> Path:
        return self.root / "logs" / f"{TOPIC}-0"

    def segments(self) -> list[Path]:
        return sorted(self.folder.glob("*.log"))

    def open(self) -> PartitionLog:
        self.close()
        self.storage = Storage(self.root, self.config)
        self.storage.open([(TOPIC, 0)])
        plog = self.storage.get(TOPIC, 0)
        assert plog is not None
        return plog

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()
            self.storage = None


@pytest.fixture
def storage_node(tmp_path: Path) -> Iterator[StorageNode]:
    """A StorageNode in the test's tmp_path, closed at teardown (re-exported by tests/conftest.py)."""
    n = StorageNode(tmp_path)
    yield n
    n.close()


def flip_byte(path: Path, at: int) -> None:
    """Damage the file at ``path``: the byte at ``at`` XOR 0x5A (a bit-rot stand-in)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 0x5A]))
