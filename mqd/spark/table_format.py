"""What kind of table ``spark.output_dir`` is, and whether the configured format may write it.

``spark.table_format`` says what the job writes: ``delta`` (the default) is a Delta Lake table, whose
``_delta_log`` is the one record of what is committed, so every Delta reader (Spark, delta-rs,
Polars, DuckDB, Trino) sees only whole batches; ``iceberg`` an Apache Iceberg table whose
``metadata/`` is that record (mqd/spark/iceberg_sink.py); ``parquet`` is the plain folder older mqd wrote,
committed only in Spark's ``_spark_metadata`` (readers that list the folder also see the files of a
killed batch). A folder already holding one kind is never written as the other: the two logs would
disagree about what the table holds. ``mqd config check`` and ``mqd spark`` refuse the mismatch and
name the way out (keep the format, or ``mqd table convert``).

No pyspark import: ``mqd config check`` runs on hosts without Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from mqd.config import MqdConfig

TableFormat = Literal["delta", "iceberg", "parquet"]

DELTA_LOG = "_delta_log"
SPARK_METADATA = "_spark_metadata"


def spark_location(place: Path | str) -> str:
    """Where Spark writes the table: a path as is, ``s3://`` through Hadoop's S3A (``s3a://``)."""
    if isinstance(place, str) and place.startswith("s3://"):
        return "s3a://" + place.removeprefix("s3://")
    return str(place)


def existing_format(output_dir: Path) -> TableFormat | None:
    """The format of the table at ``output_dir``: ``delta`` when it has a Delta log with a commit,
    ``parquet`` when it has Spark's file-sink log, None when there is no table yet (a missing or
    empty folder, or a Delta log that never committed)."""
    log = output_dir / DELTA_LOG
    if log.is_dir() and any(log.glob("*.json")):
        return "delta"
    if any((output_dir / "metadata").glob("v*.metadata.json")):  # the folder catalog's versions
        return "iceberg"
    if (output_dir / SPARK_METADATA).is_dir():
        return "parquet"
    return None


def format_problem(configured: str, output_dir: Path, key: str = "spark.table_format") -> str | None:
    """Why ``configured`` cannot write the table at ``output_dir`` (None: it can)."""
    found = existing_format(output_dir)
    if found is None or found == configured:
        return None
    if found == "parquet":
        return (
            f"{key} = {configured!r}, but {output_dir} is a parquet table (written by an mqd before "
            f'table formats): set {key} = "parquet" to keep writing it, or convert it once with '
            f"`mqd table convert` (stop `mqd spark` first)"
        )
    return (
        f"{key} = {configured!r}, but {output_dir} is already a table of format {found!r}: set "
        f"{key} = {found!r}, or give spark.output_dir (and spark.checkpoint_dir) a new place"
    )


def table_format_problem(config: MqdConfig) -> str | None:
    """Why ``spark.table_format`` cannot write the tables already at the output (and quarantine)
    folders; looked at by ``mqd config check`` and ``mqd spark``, not by every load (a daemon host
    need not see the warehouse)."""
    sc = config.spark
    places = [sc.output_dir] + ([sc.quarantine_dir] if sc.has_dead_letters else [])
    for place in places:
        if isinstance(place, str):  # an s3:// table: the job looks when it starts (no S3 call here)
            continue
        problem = format_problem(sc.table_format, place)
        if problem is not None:
            return problem
    return None


__all__ = [
    "DELTA_LOG",
    "SPARK_METADATA",
    "TableFormat",
    "existing_format",
    "format_problem",
    "spark_location",
    "table_format_problem",
]
