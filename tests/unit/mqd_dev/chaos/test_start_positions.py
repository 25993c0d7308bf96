"""The chaos run's first start (kill_before_publish with ``consume_from = "last"``) waits until the
daemons have resolved a start position for every partition. A daemon may log one assignment in
several ``start positions`` lines (seen on an s3 landing: a partition alone, then the other three);
the wait must take all of them, not the first line only, or it times out on a working pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from mqd_dev.chaos.publish_kill import assigned_partitions, resolved_partitions


def _line(positions: dict[str, list[object]]) -> str:
    return json.dumps({"event": "start positions", "positions": positions}) + "\n"


def test_resolved_partitions_take_every_start_positions_line(tmp_path: Path) -> None:
    """Two lines after the start byte resolve {0} then {1, 2, 3}: all four are resolved, while the
    first assignment alone (what kill_before_publish waits for) is [0]; lines before the start byte,
    empty assignments and non-JSON lines count for nothing."""
    log = tmp_path / "d0.log"
    log.write_text(_line({"chaos/5": [1, None, "landing"]}))
    start = log.stat().st_size
    assert resolved_partitions(log, start) == set()
    with open(log, "a") as fh:
        fh.write(_line({}) + "not json\n")
        fh.write(_line({"chaos/0": [20, None, "consume_from=last"]}))
        fh.write(_line({"chaos/1": [20, None, "x"], "chaos/3": [20, None, "x"], "chaos/2": [20, None, "x"]}))
    assert assigned_partitions(log, start) == [0]
    assert resolved_partitions(log, start) == {0, 1, 2, 3}
    assert resolved_partitions(tmp_path / "missing.log", 0) == set()
