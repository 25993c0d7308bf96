"""PartitionLog.begin_incarnation: the rule a master applies after taking records back from a
slave (issue 12, chaos seed 21). Unit tests on real segment files; no server."""

from __future__ import annotations

from pathlib import Path

from mqd.broker.storage import PartitionLog
from mqd.config import StorageConfig
from mqd.wire import format as fmt
from mqd.wire.incarnation import IncarnationEntry


def test_new_incarnation_at_the_log_end_keeps_what_the_log_holds(tmp_path: Path) -> None:
    """A log holding 0..29 under a slave's history [A@0] begins a new incarnation: the history is
    [A@0, N@30], a consumer of A is told its records end at 30 (not before: the records it holds
    are still A's), the records stay readable, and the next append is named N; the history survives
    a reopen."""
    config = StorageConfig(segment_bytes=4096, fsync="never")
    plog = PartitionLog("events", 0, tmp_path / "events-0", config)
    plog.open()
    a = "a" * 32
    plog.adopt_history([IncarnationEntry(a, 0)])
    batch = fmt.encode_batch([b"x"] * 30)
    plog.append(batch, fmt.validate(batch))
    plog.begin_incarnation("records taken back from a slave")
    new = plog.incarnation
    assert new != a
    assert plog.history == [IncarnationEntry(a, 0), IncarnationEntry(new, 30)]
    assert plog.diverged_at(a) == 30 and plog.diverged_at(new) is None
    assert plog.read(0, 1 << 20) == batch
    plog.close()
    again = PartitionLog("events", 0, tmp_path / "events-0", config)
    again.open()
    assert again.history == [IncarnationEntry(a, 0), IncarnationEntry(new, 30)]
    again.close()
