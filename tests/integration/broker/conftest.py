"""Fixtures of the broker tests that work on a data dir without a broker process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.storage_node import StorageNode


@pytest.fixture
def storage_node(tmp_path: Path) -> Iterator[StorageNode]:
    """A StorageNode in the test's tmp_path, closed at teardown."""
    n = StorageNode(tmp_path)
    yield n
    n.close()
