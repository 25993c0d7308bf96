"""The checkpoint guard's rule (mqd/spark/checkpoint_guard.problem) on checkpoints made by hand: a
query whose first batch reached the table but not its checkpoint (a crash in between) may run again
(its sink skips the batch), while a new checkpoint, another query's, or one more than a batch
behind its table is refused."""

from __future__ import annotations

import json
from pathlib import Path

from mqd.spark.checkpoint_guard import TableWriter, problem

QUERY = "5b3c1a6e-0000-4000-8000-000000000001"


def _checkpoint(root: Path, query: str | None, commits: list[int]) -> Path:
    ckpt = root / "ckpt"
    (ckpt / "commits").mkdir(parents=True)
    if query is not None:
        (ckpt / "metadata").write_text(json.dumps({"id": query}))
    for batch in commits:
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return ckpt


def test_the_first_batch_in_the_table_but_not_the_checkpoint_may_run_again(tmp_path: Path) -> None:
    """Before the fix, this crash window (batch 0 committed to the table, the process killed before
    the checkpoint's commit) was refused as "a new checkpoint" at every restart."""
    ckpt = _checkpoint(tmp_path, QUERY, [])
    assert problem("t", ckpt, TableWriter(QUERY, 0)) is None
    assert problem("t", ckpt, TableWriter(None, 0)) is None  # a file sink's log names no query


def test_what_stays_refused(tmp_path: Path) -> None:
    fresh = _checkpoint(tmp_path / "a", None, [])
    assert "is new" in (problem("t", fresh, TableWriter(QUERY, 0)) or "")
    started = _checkpoint(tmp_path / "b", QUERY, [])
    assert "is new" in (problem("t", started, TableWriter(QUERY, 1)) or "")
    assert "of query other" in (problem("t", started, TableWriter("other", 0)) or "")
    behind = _checkpoint(tmp_path / "c", QUERY, [0, 1])
    assert problem("t", behind, TableWriter(QUERY, 2)) is None  # one ahead: the sinks handle it
    assert "committed only up to 1" in (problem("t", behind, TableWriter(QUERY, 3)) or "")
