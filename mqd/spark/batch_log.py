"""The job's one log line per micro-batch: rows in, rows written, rows in the default partition, rows
with fields the schema does not name, rows dead-lettered per error class, for each query (the main
table's and the dead-letter table's); and the running totals in the job's metrics file
(mqd/spark/job_metrics.py).

Spark keeps each batch's progress on the driver (``StreamingQuery.recentProgress``); the figures
the job adds come from the query's observed metrics (``Dataset.observe`` named ``BATCH_METRICS``,
mqd/spark/job.py), which Spark computes while it writes the batch, so counting costs no second
pass over the data. A batch that read no rows logs nothing (a streaming query idles between
triggers). Figures are per batch; ``spark_query_done`` keeps the last batch's at the end.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from mqd.spark.job_metrics import JobMetrics

_log = structlog.get_logger("mqd.spark")


def batch_figures(progress: Any, metrics_name: str) -> dict[str, Any]:
    """The log line's fields of one batch's progress (a StreamingQueryProgress)."""
    durations = progress.durationMs or {}
    figures: dict[str, Any] = {
        "query": progress.name,
        "batch": progress.batchId,
        "rows_in": progress.numInputRows,
        "seconds": round(durations.get("triggerExecution", 0) / 1000, 3),
        # where a batch's time goes (Spark's phases: listing the source, planning, the write, the
        # offset and commit logs): a slow batch says which part is slow
        "phases_ms": {k: int(v) for k, v in durations.items() if k != "triggerExecution"},
    }
    observed = (progress.observedMetrics or {}).get(metrics_name)
    if observed is not None:
        row = observed.asDict()
        figures["rows_out"] = int(row.get("rows") or 0)
        for key, value in row.items():
            if key != "rows":  # default_partition_rows, extra_field_rows, dead_letter_<class>
                figures[key] = int(value or 0)
    return figures


class BatchLog:
    """Logs ``spark_batch_done`` once for each batch of the running queries: ``poll`` reads each
    query's ``recentProgress`` (the last 100 batches, Spark's default) and logs the batches it has
    not logged yet. Polled beside the queries and once after they end, so a ``--once`` run logs
    every batch before it returns (a listener's events arrive on Spark's bus, possibly later)."""

    def __init__(self, metrics_name: str, metrics: JobMetrics | None = None) -> None:
        self.metrics_name = metrics_name
        self.metrics = metrics  # totals written after each poll that logged a batch
        self._logged: dict[str, int] = {}  # query run id -> the newest batch logged
        self._lock = threading.Lock()  # the poller thread and the job's end both poll

    def poll(self, queries: list[Any]) -> None:
        with self._lock:
            logged = False
            for query in queries:
                for progress in query.recentProgress:
                    run = str(progress.runId)
                    if progress.batchId <= self._logged.get(run, -1):
                        continue
                    self._logged[run] = progress.batchId
                    if progress.numInputRows:
                        self._log(progress)
                        logged = True
            if logged and self.metrics is not None:
                try:
                    self.metrics.write()
                except OSError as exc:  # figures only: never fails the job
                    _log.warning("spark_metrics_file_failed", file=str(self.metrics.path), error=str(exc))

    def record(self, figures: dict[str, Any]) -> None:
        """Log and count one batch whose figures its writer made itself (a ``foreachBatch`` sink,
        mqd/spark/typed_sink.py: its query is not polled)."""
        with self._lock:
            if self.metrics is not None:
                self.metrics.add_batch(str(figures["query"]), figures)
            _log.info("spark_batch_done", **figures)
            if self.metrics is not None:
                try:
                    self.metrics.write()
                except OSError as exc:
                    _log.warning("spark_metrics_file_failed", file=str(self.metrics.path), error=str(exc))

    def _log(self, progress: Any) -> None:
        figures = batch_figures(progress, self.metrics_name)
        if self.metrics is not None:
            self.metrics.add_batch(str(progress.name), figures)
        if figures.get("default_partition_rows"):
            _log.warning("spark_batch_done", **figures, note="rows in the default (null) partition")
        else:
            _log.info("spark_batch_done", **figures)


__all__ = ["BatchLog", "batch_figures"]
