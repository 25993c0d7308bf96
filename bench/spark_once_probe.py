"""``mqd spark`` with a stopwatch on each step of the job (bench/spark_once.py ``--profile``).

Runs the real CLI (``mqd.operator.cli.main``) in this process after wrapping the job's steps, so nothing of
mqd is edited: the landing check (``unlisted_files``), the session (``open_session``: JVM start,
Ivy, the SparkContext), the query plan, the checkpoint guard (Delta's history, so a log replay), the
lifecycle's register and record, the maintenance check, each query's start and run, the batch
log's polls and ``spark.stop``. Each step prints one line to stderr,
``probe <step> start=<epoch s> seconds=<s>``, which the benchmark puts on the spawn's clock.

    python bench/spark_once_probe.py spark --once -c mqd.toml
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

_T_IMPORT = time.time()


def _say(step: str, start: float, seconds: float) -> None:
    print(f"probe {step} start={start:.3f} seconds={seconds:.3f}", file=sys.stderr, flush=True)


def _timed(owner: Any, attr: str, step: str) -> None:
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.time()
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _say(step, start, time.perf_counter() - t0)

    setattr(owner, attr, wrapper)


def main() -> int:
    t0 = time.perf_counter()
    import mqd.operator.cli

    _say("import_mqd_cli", _T_IMPORT, time.perf_counter() - t0)
    start = time.time()
    t0 = time.perf_counter()
    import pyspark.sql
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from mqd.spark import batch_log, job, table_maintenance

    _say("import_pyspark_and_job", start, time.perf_counter() - t0)
    _timed(job, "unlisted_files", "unlisted_files")
    _timed(job, "open_session", "open_session")
    _timed(job, "_queries", "plan")
    _timed(job, "_checkpoint_mismatch", "checkpoint_guard")
    _timed(job, "_maintenance", "maintenance_schedule")
    _timed(job._Recorder, "register", "lifecycle_register")
    _timed(job._Recorder, "record", "lifecycle_record")
    _timed(table_maintenance.MaintenanceSchedule, "run_if_due", "maintenance_run_if_due")
    _timed(batch_log.BatchLog, "poll", "batch_log_poll")
    _timed(DataStreamWriter, "start", "query_start")
    _timed(StreamingQuery, "awaitTermination", "query_run")
    _timed(pyspark.sql.SparkSession, "stop", "spark_stop")
    sys.argv = ["mqd", *sys.argv[1:]]
    try:
        mqd.operator.cli.main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
