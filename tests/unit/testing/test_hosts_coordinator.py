"""HostRig.coordinator_host finds the coordinator whichever broker leads the group's partition of
``__consumer_offsets``, broker 0 included: it waited on the leader's index itself, and 0 is falsy,
so a group led from broker 0 timed out after 60 s (CI, 2026-12-02: the group "zombie" maps to
partition 40, led by broker 0 in that run). No rig is started: the metadata seam is a stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mqd.testing.hosts import OFFSETS_PARTITIONS, HostRig, _java_hash


class _Metadata:
    """What coordinator_host reads of the cluster: leader() and the hosts by broker index."""

    def __init__(self, leader: int | None) -> None:
        self._leader = leader
        self.hosts = ["k0", "k1", "k2"]
        self.asked: list[tuple[str, int]] = []

    def leader(self, topic: str, partition: int, timeout: float = 5.0) -> int | None:
        self.asked.append((topic, partition))
        return self._leader


@pytest.mark.parametrize("leader", [0, 1, 2])
def test_the_coordinator_is_found_on_every_broker(tmp_path: Path, leader: int) -> None:
    rig = HostRig(tmp_path)
    meta = _Metadata(leader)
    rig.kafka = meta  # type: ignore[assignment]  # the stand-in has what the method reads
    found: Any = rig.coordinator_host("zombie", timeout=2.0)
    assert found == f"k{leader}"
    assert meta.asked == [("__consumer_offsets", _java_hash("zombie") % OFFSETS_PARTITIONS)]


def test_no_leader_times_out_naming_the_partition(tmp_path: Path) -> None:
    rig = HostRig(tmp_path)
    rig.kafka = _Metadata(None)  # type: ignore[assignment]
    with pytest.raises(TimeoutError, match="__consumer_offsets partition 40"):
        rig.coordinator_host("zombie", timeout=0.3)


def test_java_hash_matches_javas_string_hashcode() -> None:
    """Values of ``String.hashCode`` made non-negative as Kafka's Utils.abs does."""
    assert _java_hash("") == 0
    assert _java_hash("a") == 97
    assert _java_hash("zombie") % OFFSETS_PARTITIONS == 40
