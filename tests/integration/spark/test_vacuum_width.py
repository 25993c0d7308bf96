"""Delta's VACUUM walks a table's folders in the session's listing width (decision 068). With
Spark's default, 10,000 tasks however few folders there are, a three-file table's VACUUM took 50-64
s on 2 cores, and the job's maintenance ran it for every table at every interval. No timing is
asserted: the tasks of the VACUUM's stages are counted by Spark's status tracker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mqd.spark.table_maintenance import vacuum

GROUP = "mqd-test-vacuum-width"


def test_vacuum_runs_no_stage_wider_than_the_shuffle_width(spark: Any, tmp_path: Path) -> None:
    """A VACUUM of a table of three appends runs Spark jobs (the folder walk among them), none of
    whose stages has more tasks than the session's shuffle width (2 in the test session)."""
    table = str(tmp_path / "t")
    for i in range(3):
        spark.range(i * 10, i * 10 + 10).write.format("delta").mode("append").save(table)
    sc = spark.sparkContext
    width = int(spark.conf.get("spark.sql.shuffle.partitions"))
    sc.setJobGroup(GROUP, "VACUUM of a three-file table")
    try:
        vacuum(spark, table, 1.0)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup(GROUP)
        for stage in (tracker.getJobInfo(job) or ()).stageIds  # type: ignore[union-attr]
    ]
    tasks = [info.numTasks for info in stages if info is not None]
    assert tasks, "the VACUUM ran no job in its group: the count proves nothing"
    assert max(tasks) <= width, tasks
