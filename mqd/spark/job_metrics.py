"""The Spark job's counters in a Prometheus text file: what it read, wrote, dead-lettered.

The job serves no HTTP endpoint (it is a batch-like process, and Spark's UI is off by default), so
its figures go where Prometheus picks up batch jobs' figures: a text file in the exposition format,
rewritten whole (temp file + rename) after each batch, for node_exporter's textfile collector (point
``--collector.textfile.directory`` at its folder, or link the file there) or for a person's ``cat``.
It lives at ``<spark.checkpoint_dir>/metrics.prom`` (the folder the job owns); the totals survive
restarts, since the job reads the file back when it starts. A lost update (a crash between a batch's
commit and the file's rewrite) undercounts that batch: these are figures for alerts and dashboards,
not the exactly-once ledger (the table is).

Pure: no pyspark import.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

FILE_NAME = "metrics.prom"

# figure of a batch (mqd/spark/batch_log.py) -> (metric name, help)
_COUNTERS: dict[str, tuple[str, str]] = {
    "rows_in": ("mqd_spark_rows_read_total", "Landed records the query read."),
    "rows_out": ("mqd_spark_rows_written_total", "Rows the query wrote to its table."),
    "default_partition_rows": (
        "mqd_spark_default_partition_rows_total",
        "Rows written to the default (null) partition: a partition expression gave null.",
    ),
    "extra_field_rows": (
        "mqd_spark_extra_field_rows_total",
        "Rows whose value had fields value_schema does not name (kept in _extra).",
    ),
}
_DEAD_LETTERS = (
    "mqd_spark_dead_letter_rows_total",
    "Records written to the dead-letter table, by error class.",
)
_BATCHES = ("mqd_spark_batches_total", "Micro-batches that read at least one record.")
_LAST = ("mqd_spark_last_batch_timestamp_seconds", "When the query last finished a batch that read records.")
_LINE = re.compile(r'^([a-z_]+)\{query="([^"]*)"(?:,error_class="([^"]*)")?\} ([0-9.eE+-]+)$')

Key = tuple[str, str, str]  # (metric, query, error class or "")


class JobMetrics:
    """Totals per query, read from and written to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[Key, float] = {}

    def load(self) -> JobMetrics:
        """The totals of the job's earlier runs (a missing or foreign line is ignored)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return self
        for line in text.splitlines():
            m = _LINE.match(line)
            if m is not None:
                self.values[(m.group(1), m.group(2), m.group(3) or "")] = float(m.group(4))
        return self

    def add_batch(self, query: str, figures: Mapping[str, object], now: float | None = None) -> None:
        """Count one batch's figures (batch_log.batch_figures)."""
        for figure, value in figures.items():
            if not isinstance(value, int):
                continue
            if figure in _COUNTERS:
                key: Key = (_COUNTERS[figure][0], query, "")
            elif figure.startswith("dead_letter_"):
                key = (_DEAD_LETTERS[0], query, figure.removeprefix("dead_letter_"))
            else:
                continue
            self.values[key] = self.values.get(key, 0) + value
        self.values[(_BATCHES[0], query, "")] = self.values.get((_BATCHES[0], query, ""), 0) + 1
        self.values[(_LAST[0], query, "")] = now if now is not None else time.time()

    def render(self) -> str:
        helps = {name: (text, "counter") for name, text in [*_COUNTERS.values(), _DEAD_LETTERS, _BATCHES]}
        helps[_LAST[0]] = (_LAST[1], "gauge")
        out: list[str] = []
        for metric in sorted({k[0] for k in self.values}):
            text, kind = helps.get(metric, ("", "untyped"))
            out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            for (name, query, error_class), value in sorted(self.values.items()):
                if name != metric:
                    continue
                labels = f'query="{query}"' + (f',error_class="{error_class}"' if error_class else "")
                out.append(f"{metric}{{{labels}}} {value:.17g}")
        return "\n".join(out) + "\n"

    def write(self) -> None:
        """Rewrite the file whole: a scraper never reads half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(self.render())
        os.replace(tmp, self.path)


__all__ = ["FILE_NAME", "JobMetrics"]
