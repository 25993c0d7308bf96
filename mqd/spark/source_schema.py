"""The columns the job's streaming source hands to Spark, whichever source reads the landing
(Spark's file source on a directory, mqd/spark/landing_source.py on an ``s3://`` landing): the
landing's columns with ``timestamp`` as its raw epoch ms, the folders' ``dt``/``hour``, and the
file each row was read from (kept for dead letters). The job and the sources import it; it imports
neither, so they import each other in one direction only.
"""

from __future__ import annotations

from typing import Any

from mqd.landing.schema import LANDING_SCHEMA, PARTITION_COLUMNS, spark_type

SOURCE_FILE_COLUMN = "_mqd_source_file"  # the file a row was read from (the quarantine's source_file)


def _column(f: Any) -> str:
    # timestamp as BIGINT: the raw epoch ms (Parquet's TIMESTAMP(MILLIS) reads as its int64)
    return f"{f.name} {'BIGINT' if f.name == 'timestamp' else spark_type(f.type)}"


def source_ddl() -> str:
    """The DDL the job reads the landing with: the landing's, with ``timestamp`` as BIGINT (the
    raw epoch ms), clamped afterwards."""
    cols = [_column(f) for f in LANDING_SCHEMA]
    cols += [f"{name} {sql}" for name, sql in PARTITION_COLUMNS]
    return ", ".join(cols)


def file_source_ddl() -> str:
    """``source_ddl`` in the order Spark's file source gives the columns once it has seen a folder:
    the file's columns, then the folders' (``topic=``, ``dt=``, ``hour=``: ``topic`` is both). A
    source started on an empty landing keeps the declared order, and its first batch reads files in
    folders: in any other order that batch's plan fails (PLAN_VALIDATION_FAILED_RULE_IN_BATCH,
    CollapseProject), so a job started on an empty landing exited 1 once files landed."""
    cols = [_column(f) for f in LANDING_SCHEMA if f.name != "topic"]
    cols += [_column(LANDING_SCHEMA.field("topic"))]
    cols += [f"{name} {sql}" for name, sql in PARTITION_COLUMNS]
    return ", ".join(cols)


def source_file_column(is_object_landing: bool) -> Any:
    """The streaming source's column naming each row's landed file (kept for dead letters)."""
    from pyspark.sql import functions as F

    if is_object_landing:
        return F.col(SOURCE_FILE_COLUMN)
    return F.col("_metadata.file_path")


__all__ = ["SOURCE_FILE_COLUMN", "file_source_ddl", "source_ddl", "source_file_column"]
