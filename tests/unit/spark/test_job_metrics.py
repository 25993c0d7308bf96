"""The Spark job's metrics file (mqd/spark/job_metrics.py): totals per query and error class in the
Prometheus text format, carried across restarts."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mqd.spark.job_metrics import JobMetrics


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_batches_add_up_per_query_and_class_and_survive_a_restart(tmp_path: Path) -> None:
    """Two batches of the main query and one of the dead-letter query sum per figure; the file is
    valid exposition format (Prometheus' own parser reads it) and a new JobMetrics continues from it."""
    path = tmp_path / "ckpt" / "metrics.prom"
    m = JobMetrics(path).load()
    m.add_batch(
        "mqd-events", {"rows_in": 10, "rows_out": 8, "default_partition_rows": 2, "batch": 0}, now=5.0
    )
    m.add_batch("mqd-events", {"rows_in": 4, "rows_out": 4, "extra_field_rows": 1, "batch": 1}, now=6.0)
    m.add_batch("mqd-events-quarantine", {"rows_in": 14, "rows_out": 2, "dead_letter_not_json": 2}, now=6.0)
    m.write()
    got = samples(path.read_text())
    main = (("query", "mqd-events"),)
    assert got[("mqd_spark_rows_read_total", main)] == 14
    assert got[("mqd_spark_rows_written_total", main)] == 12
    assert got[("mqd_spark_default_partition_rows_total", main)] == 2
    assert got[("mqd_spark_extra_field_rows_total", main)] == 1
    assert got[("mqd_spark_batches_total", main)] == 2
    assert got[("mqd_spark_last_batch_timestamp_seconds", main)] == 6.0
    dl = (("error_class", "not_json"), ("query", "mqd-events-quarantine"))
    assert got[("mqd_spark_dead_letter_rows_total", dl)] == 2

    again = JobMetrics(path).load()
    again.add_batch("mqd-events", {"rows_in": 1, "rows_out": 1})
    again.write()
    assert samples(path.read_text())[("mqd_spark_rows_read_total", main)] == 15
    assert not list(path.parent.glob(".*.tmp"))
