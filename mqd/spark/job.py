"""The Structured Streaming job: landing directory -> output table (Delta Lake or Parquet), exactly once.

The source is Spark's file source on the landing directory with an explicit schema (never
inferred: derived from the landing's Arrow schema, mqd.landing.schema); ``_``/``.`` paths (state,
manifest, markers, temp files) are ignored by Spark, foreign non-Parquet files by
``pathGlobFilter``. The job never skips what it cannot read: a corrupt or truncated Parquet file
fails the query, and the job exits 1 with an error naming the file (``ignoreCorruptFiles`` would
skip the rest of the file, records that read fine included, and exit 0). The job lists the files
that are not in the manifest at start. The sink is Spark's file sink, exactly once through its
checkpoint. The table is ``spark.table_format`` (mqd/spark/table_format.py): a Delta Lake table by
default, written by Delta's streaming sink, which commits each micro-batch to the Delta log with the
query's id and the batch id as a transaction (``txn``), so a batch re-run after a crash is skipped when
its commit had landed and written whole when it had not; files of a killed batch are in no commit, so
no Delta reader (Spark, delta-rs, Polars, DuckDB) ever sees them. ``parquet`` keeps the plain folder
of Spark's file sink, committed only in ``_spark_metadata``: read it with Spark (or anything that
honours that log).

An ``s3://`` landing (``landing.dir = "s3://bucket/prefix"``) is read instead by mqd's Python data
source (mqd/spark/landing_source.py: the files the claim chains name, through the store's own S3
client, offsets per partition chain in the checkpoint), because the pip pyspark has no S3A jars;
the rest of the job (clamping, JSON mode, names, exit codes) is the same. Its Python workers need
mqd: on a local master they run this interpreter (``python_workers``).

Timestamps: a landed record keeps its producer's ``timestamp`` (epoch ms, any int64). Spark's
TIMESTAMP holds microseconds, and reading a millisecond value past that (a producer stamping
nanoseconds) fails the whole file. So the job reads the column as BIGINT and writes ``timestamp``
clamped to the range the landing files folders under (1970-01-01 .. 9999-12-31T23:59:59.999Z,
layout.folder_hours: so ``timestamp`` agrees with ``dt``/``hour``), with the producer's value in
``timestamp_raw_ms`` when it was clamped (null otherwise): nothing is lost, every record is
readable, also by Python clients (datetime stops at year 9999).

Schema changes: the output table only gains columns (``timestamp_raw_ms``; the landing's own new
columns, derived from mqd.landing.schema). An existing checkpoint keeps working (the query is
stateless); files written before a change lack the new columns, so read the table with
``mergeSchema`` (or an explicit schema): they read as null there.

``value_format = "json"`` parses values with the configured DDL schema into columns; rows whose
value is not valid JSON for that schema go, with the reason, to a quarantine table written by a
second query over the same source with its own checkpoint.

Lifecycle: the job registers each query in the landing (mqd/landing/lifecycle.py) before it
starts, and rewrites the query's record from its checkpoint after batches commit (every
``RECORD_INTERVAL_S`` while running, and once at the end), so the cleaner deletes only what every
query has committed. The checkpoint must be a local (or mounted) directory for this.

Names and exit codes: the query is ``mqd-<table>`` (the output directory's name; its quarantine
query ``mqd-<table>-quarantine``), the same in Spark and in every log line of the job. The job
exits 0 when done (``--once``) or stopped, 1 when a query failed, 2 on a bad configuration (also
what ``mqd config check`` refuses: mqd/spark/static_checks.py), 75 when no Spark session could be
created (mqd/spark/session.py).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, cast

import structlog

from mqd.config import MqdConfig
from mqd.errors import MqdError
from mqd.landing.backends import open_store
from mqd.landing.chain_reader import ChainReader
from mqd.landing.errors import LifecycleConflict
from mqd.landing.schema import landing_columns, landing_ddl
from mqd.landing.store import LandingStore
from mqd.spark import dead_letters as dl
from mqd.spark.batch_log import BatchLog
from mqd.spark.extra_fields import EXTRA_COLUMN, extra_fields
from mqd.spark.partitioning import PartitionField, parse_all
from mqd.spark.session import EXIT_SESSION, SessionError, build_session, is_local_master, open_session
from mqd.spark.source_schema import SOURCE_FILE_COLUMN, file_source_ddl, source_file_column
from mqd.spark.static_checks import RAW_TIMESTAMP_COLUMN, master_problem, partition_problem

_log = structlog.get_logger("mqd.spark")

BATCH_LOG_INTERVAL_S = 2.0  # between reads of the queries' progress for the per-batch log line
RECORD_INTERVAL_S = 5.0  # between lifecycle records of a running query (cheap when no batch committed)

CORRUPT_COLUMN = "_mqd_corrupt_record"
BATCH_METRICS = "mqd_batch"  # the name of each query's observed metrics (Dataset.observe)
DEAD_LETTER_PREFIX = "dead_letter_"  # an observed metric per error class: dead_letter_<class>
DEAD_LETTER_STAMP_DIR = "dead-letters"  # typed Iceberg dead letters' maintenance clock (in the checkpoint)
LANDING_DDL = landing_ddl()  # derived from the Arrow schema (mqd.landing.schema)
_LANDING_COLUMNS = landing_columns()
# the landing's folder range (layout.folder_hours), in epoch ms: 1970-01-01 .. 9999-12-31T23:59:59.999Z
MIN_TS_MS = 0
MAX_TS_MS = 253_402_300_799_999
# Spark's message for a file its reader failed on: "... while reading file <path>.  SQLSTATE ..."
_FAILED_FILE = re.compile(r"while reading file (\S+?)\.?\s")


def output_columns() -> list[str]:
    """The raw table's columns: the landing's, then the raw timestamp of a clamped record."""
    return [*_LANDING_COLUMNS, RAW_TIMESTAMP_COLUMN]


class SparkJobError(MqdError):
    """The job cannot run as configured (bad partition columns, bad value schema). Not retriable."""

    retriable = False


def unlisted_files(landing: Path) -> list[Path]:
    """Data-looking files in the landing directory that mqd did not publish (foreign or corrupt
    files dropped in by hand, or a publication a crash left half done), listed at start: a
    corrupt one fails the job when Spark reaches it, a foreign one's rows are left out. What is
    visible and what is published both come from the store (store.py), read without writing."""
    return sorted(landing / rel for rel in _unlisted(open_store(landing)))


def _unlisted(store: LandingStore) -> list[str]:
    """The store's visible data files that no claim names (keys). Read-only: the job may run on a
    read-only landing (or with read-only keys), and resolving a chain's head would finish a
    publication a writer left half done, a write (a job started on a read-only landing died on it)."""
    views = ChainReader(store.objects).refresh().values()
    known = {r.path for v in views for r in (*v.files, *([v.pending] if v.pending else []))}
    return [k for k in store.visible_files() if k not in known]


def python_workers(master: str) -> None:
    """An ``s3://`` landing is read by Python code in Spark's Python workers (landing_source), which
    need mqd and its dependencies: on a local master, this interpreter (Spark's default is the
    ``python3`` on PATH). A cluster's workers are the operator's (PYSPARK_PYTHON). Read when the
    SparkContext starts."""
    if is_local_master(master):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def unlisted_objects(config: MqdConfig) -> list[str]:
    """``unlisted_files`` of an ``s3://`` landing: visible objects no claim names (URIs). The
    job's source never reads them (it reads what the claim chains name)."""
    s3 = config.landing.s3
    store = open_store(str(config.landing.dir), endpoint_url=s3.endpoint_url, region=s3.region)
    return [f"{store.location}/{k}" for k in _unlisted(store)]


def query_name(config: MqdConfig, quarantine: bool = False) -> str:
    """The query's one name, in Spark and in the logs: ``mqd-<table>`` (the output directory's
    name), stable across runs and restarts."""
    table = Path(config.spark.output_dir).name or "table"
    return f"mqd-{table}-quarantine" if quarantine else f"mqd-{table}"


def is_object_landing(config: MqdConfig) -> bool:
    """``landing.dir`` is an ``s3://`` URI: the job reads it through mqd.spark.landing_source."""
    return isinstance(config.landing.dir, str) and config.landing.dir.startswith("s3://")


def _source(spark: Any, config: MqdConfig) -> Any:
    """The landing as a stream, ``timestamp`` clamped to Spark's range (module docstring). An
    ``s3://`` landing also carries the file of each row (source_schema.SOURCE_FILE_COLUMN)."""
    from pyspark.sql import functions as F

    extra: list[Any] = []
    if is_object_landing(config):
        from mqd.spark import landing_source

        s3 = config.landing.s3
        df = landing_source.stream(
            spark, str(config.landing.dir), s3.endpoint_url, s3.region, config.spark.max_files_per_trigger
        )
        extra = [F.col(SOURCE_FILE_COLUMN)]
    else:
        df = (
            spark.readStream.schema(file_source_ddl())
            .option("maxFilesPerTrigger", config.spark.max_files_per_trigger)
            .option("pathGlobFilter", "*.parquet")
            .option("ignoreCorruptFiles", "false")
            .parquet(str(config.landing.dir))
        )
    raw = F.col("timestamp")
    # not least/greatest: they skip nulls, and a foreign file's rows have a null timestamp
    clamped = F.when(raw < MIN_TS_MS, MIN_TS_MS).when(raw > MAX_TS_MS, MAX_TS_MS).otherwise(raw)
    return df.select(
        *[F.timestamp_millis(clamped).alias(c) if c == "timestamp" else F.col(c) for c in _LANDING_COLUMNS],
        F.when((raw < MIN_TS_MS) | (raw > MAX_TS_MS), raw).alias(RAW_TIMESTAMP_COLUMN),
        *extra,
    )


def _value_schema(ddl: str) -> Any:
    """``spark.value_schema`` as a Spark struct, or SparkJobError naming what is wrong with it."""
    from pyspark.sql.types import StructType

    try:
        value_schema = StructType.fromDDL(ddl)
    except Exception as exc:  # Spark raises its own parse exception types
        raise SparkJobError(f"spark.value_schema is not a valid Spark DDL schema: {exc}") from None
    if not isinstance(value_schema, StructType):
        raise SparkJobError("spark.value_schema must be a list of fields: 'a INT, b STRING'")
    if CORRUPT_COLUMN in value_schema.fieldNames():
        raise SparkJobError(f"spark.value_schema must not use the reserved column {CORRUPT_COLUMN}")
    return value_schema


def _json_dead_letters(checked: Any, config: MqdConfig) -> Any:
    """JSON mode's rows with a ``_reason``, as dead letters (dead_letters.py's columns), counted per
    error class in the batch's observed metrics."""
    from pyspark.sql import functions as F

    source_file = source_file_column(is_object_landing(config))
    message = F.lit(None).cast("string")
    for name, text in reversed([(c, dl.ERROR_CLASSES[c]) for c in dl.JSON_CLASSES]):
        message = F.when(F.col("_reason") == name, F.lit(text)).otherwise(message)
    bad = checked.where(F.col("_reason").isNotNull()).select(
        *output_columns(),
        F.col("_reason").alias(dl.ERROR_CLASS_COLUMN),
        message.alias(dl.ERROR_MESSAGE_COLUMN),
        F.lit(None).cast("int").alias(dl.SCHEMA_ID_COLUMN),
        source_file.alias(dl.SOURCE_FILE_COLUMN),
        F.current_timestamp().alias(dl.DEAD_LETTERED_AT_COLUMN),
    )
    per_class = [
        F.sum(F.when(F.col(dl.ERROR_CLASS_COLUMN) == name, 1).otherwise(0)).alias(
            f"{DEAD_LETTER_PREFIX}{name}"
        )
        for name in dl.JSON_CLASSES
    ]
    return bad.observe(BATCH_METRICS, F.count(F.lit(1)).alias("rows"), *per_class)


def _queries(spark: Any, config: MqdConfig) -> list[tuple[str, Any, str, Path, list[str]]]:
    """(name, dataframe, output location, checkpoint, partition columns) per streaming query."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    sc = config.spark
    checkpoint = Path(sc.checkpoint_dir)
    df = _source(spark, config)
    # a foreign Parquet file read with the landing schema yields rows without partition/offset
    foreign = F.col("partition").isNull() | F.col("offset").isNull()
    fields = parse_all(sc.partition_by)  # checked by the config's load
    if is_typed(config):
        # one query: its foreachBatch writes the table and the dead letters (typed_sink.py)
        from mqd.spark.typed_sink import SOURCE_FILE

        typed = df.withColumn(SOURCE_FILE, source_file_column(is_object_landing(config)))
        out = _table_location(sc.table_format, sc.output_dir)
        return [(query_name(config), typed, out, checkpoint / "main", _sink_parts(fields))]
    if sc.value_format == "raw":
        # reported by unlisted_files() at start; there is no quarantine table in raw mode
        _check_partitioning(sc.partition_by, output_columns(), sc.table_format)
        main = _partitioned(df.where(~foreign).select(*output_columns()), fields, extra=None)
        return [
            (
                query_name(config),
                main,
                _table_location(sc.table_format, sc.output_dir),
                checkpoint / "main",
                _sink_parts(fields),
            )
        ]

    value_schema = _value_schema(sc.value_schema)
    parse_schema = StructType([*value_schema.fields, StructField(CORRUPT_COLUMN, StringType())])
    parsed = df.withColumn(
        "_v",
        F.from_json(
            F.col("value").cast("string"),
            parse_schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN},
        ),
    )
    # a tombstone (null value) is a row with null value columns, not an error (dead_letters.py)
    error_class = (
        F.when(foreign, F.lit(dl.FOREIGN_FILE))
        .when(F.col("value").isNull(), F.lit(None).cast("string"))
        .when(F.json_object_keys(F.col("value").cast("string")).isNull(), F.lit(dl.NOT_JSON))
        .when(F.col(f"_v.{CORRUPT_COLUMN}").isNotNull(), F.lit(dl.SCHEMA_MISMATCH))
    )
    checked = parsed.withColumn("_reason", error_class)
    keep = [c for c in output_columns() if c != "value"]
    clash = {*keep, EXTRA_COLUMN} & set(value_schema.fieldNames())
    if clash:
        raise SparkJobError(f"spark.value_schema fields clash with the table's columns: {sorted(clash)}")
    good = checked.where(F.col("_reason").isNull()).select(
        *keep,
        *[F.col(f"_v.{f.name}").alias(f.name) for f in value_schema.fields],
        extra_fields(F.col("value").cast("string"), value_schema.fieldNames()).alias(EXTRA_COLUMN),
    )
    _check_partitioning(sc.partition_by, good.columns, sc.table_format)
    good = _partitioned(good, fields, extra=EXTRA_COLUMN)
    bad = _json_dead_letters(checked, config)
    qparts = [f.name for f in fields if f.is_column and f.name in _LANDING_COLUMNS]
    return [
        (
            query_name(config),
            good,
            _table_location(sc.table_format, sc.output_dir),
            checkpoint / "main",
            _sink_parts(fields),
        ),
        (
            query_name(config, quarantine=True),
            bad,
            _table_location(sc.table_format, sc.quarantine_dir),
            checkpoint / "quarantine",
            qparts,
        ),
    ]


def is_typed(config: MqdConfig) -> bool:
    """The key or the value is decoded by a registry schema (mqd/spark/typed_sink.py)."""
    from mqd.config import REGISTRY_FORMATS

    return config.spark.value_format in REGISTRY_FORMATS or config.spark.key_format in REGISTRY_FORMATS


def _typed_sink(spark: Any, config: MqdConfig, batch_log: BatchLog) -> Any:
    """The foreachBatch sink of the typed query, its decoders ready (the table's columns read back)."""
    from mqd.config import REGISTRY_FORMATS
    from mqd.spark.schema_registry import SchemaRegistryClient
    from mqd.spark.typed_records import Format, registry_lookup
    from mqd.spark.typed_sink import TypedSink

    sc = config.spark
    assert sc.schema_registry is not None  # the config's check
    fields = parse_all(sc.partition_by)
    typed_key = sc.key_format in REGISTRY_FORMATS
    envelope = [c for c in output_columns() if c != "value" and not (typed_key and c == "key")]
    lookup = registry_lookup(SchemaRegistryClient(sc.schema_registry), sc.schema_registry.retry_timeout)
    name = query_name(config)

    out = _table_location(sc.table_format, sc.output_dir)
    dead_letters = _table_location(sc.table_format, sc.quarantine_dir)
    checkpoint = Path(sc.checkpoint_dir) / "main"  # the typed query's (_queries)

    def iceberg(location: str, parts: list[str], query: str) -> Any:
        from mqd.spark.iceberg_sink import IcebergSink
        from mqd.spark.table_maintenance import MaintenanceSchedule

        # each table's schedule keeps its own clock in the query's checkpoint
        stamp = checkpoint / DEAD_LETTER_STAMP_DIR if location == dead_letters else checkpoint
        return IcebergSink(
            location,
            partition_by=parts,
            catalog=sc.iceberg_catalog,
            query_name=query,
            file_io=iceberg_file_io(config),
            maintenance=MaintenanceSchedule(config, [location], stamp_dir=stamp),
        )

    return TypedSink(
        spark=spark,
        table_format=sc.table_format,
        out=out,
        dead_letters=dead_letters,
        partitions=fields,
        parts=_sink_parts(fields),
        dead_letter_parts=[f.name for f in fields if f.is_column and f.name in _LANDING_COLUMNS],
        envelope=envelope,
        dead_letter_columns=output_columns(),
        value=(lookup, cast(Format, sc.value_format)) if sc.value_format in REGISTRY_FORMATS else None,
        key=(lookup, cast(Format, sc.key_format)) if typed_key else None,
        query_name=name,
        iceberg=iceberg,
        on_batch=batch_log.record,
    ).start()


def _partitioned(df: Any, fields: list[PartitionField], extra: str | None) -> Any:
    """``df`` with each expression of ``spark.partition_by`` as its column, observed per batch
    (BATCH_METRICS: rows out, rows in the default partition, rows with extra fields) for the job's
    per-batch log line (mqd/spark/batch_log.py)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    for f in fields:
        if f.expression is None:
            continue
        try:
            df = df.withColumn(f.name, F.expr(f.expression))
            df.schema  # noqa: B018 -- analysis happens here: a bad expression fails now, not in a batch
        except (AnalysisException, ValueError) as exc:
            raise SparkJobError(f"spark.partition_by {f.entry!r}: {str(exc).splitlines()[0]}") from None
    nullable = [F.col(c).isNull() for f in fields if (c := f.nullable_input) is not None]
    default = F.lit(False)
    for cond in nullable:
        default = default | cond
    metrics = [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(default, 1).otherwise(0)).alias("default_partition_rows"),
        F.sum(F.when(F.col(extra).isNotNull(), 1).otherwise(0) if extra else F.lit(0)).alias(
            "extra_field_rows"
        ),
    ]
    return df.observe(BATCH_METRICS, *metrics)


def _sink_parts(fields: list[PartitionField]) -> list[str]:
    """What the sink partitions by: the table's columns (a computed one by its name), and for an
    Iceberg table the transforms as written (iceberg_sink parses them)."""
    return [f.entry if f.transform is not None else f.name for f in fields]


def _table_location(table_format: str, place: Path | str) -> str:
    """Where the sink writes: Spark's (S3A: ``s3a://``) for Delta and Parquet; for Iceberg,
    written by pyiceberg and named in its metadata, the configured ``s3://`` URI as it is."""
    from mqd.spark.table_format import spark_location

    return str(place) if table_format == "iceberg" else spark_location(place)


def _landing_store(config: MqdConfig) -> LandingStore:
    s3 = config.landing.s3
    return open_store(str(config.landing.dir), endpoint_url=s3.endpoint_url, region=s3.region)


class _Recorder:
    """Keeps each query's lifecycle record (mqd/landing/lifecycle.py) in step with its checkpoint.
    A failure to write a record is logged, never fails the job: a stale record only holds files
    back longer."""

    def __init__(self, config: MqdConfig, queries: list[tuple[str, Path]]) -> None:
        self.store = _landing_store(config)
        self.root = None if is_object_landing(config) else Path(config.landing.dir)
        self.queries = queries
        self._batch: dict[str, int | None] = {}
        self._reader: ChainReader | None = None  # kept across records: each reads only new claims

    def register(self) -> None:
        from mqd.landing import lifecycle

        for name, ckpt in self.queries:
            try:
                lifecycle.register(self.store, name, str(ckpt))
            except LifecycleConflict:
                raise  # running would let the other query's progress release this one's files
            except (MqdError, OSError) as exc:
                _log.warning("lifecycle_register_failed", query=name, error=str(exc))

    def record(self) -> None:
        from mqd.landing import lifecycle

        for name, ckpt in self.queries:
            try:
                batch = lifecycle.last_committed_batch(ckpt)
                if batch is None or self._batch.get(name) == batch:
                    continue
                if self._reader is None:
                    self._reader = ChainReader(self.store.objects)
                batch, committed = lifecycle.checkpoint_committed(
                    self.store, ckpt, file_source_root=self.root, reader=self._reader
                )
                lifecycle.record_committed(self.store, name, committed, batch, str(ckpt))
                self._batch[name] = batch
            except (MqdError, OSError, ValueError) as exc:
                _log.warning("lifecycle_record_failed", query=name, error=str(exc))

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(RECORD_INTERVAL_S):
            self.record()


def _check_partitioning(partition_by: list[str], columns: list[str], table_format: str) -> None:
    problem = partition_problem(partition_by, columns, table_format)
    if problem is not None:
        raise SparkJobError(f"spark.partition_by {problem}")


def run(config: MqdConfig, *, once: bool, master: str | None = None) -> int:
    """Run the job, holding the table's job lock (mqd/spark/table_maintenance.py) throughout.
    Returns what :func:`_run` does, or EXIT_SESSION while ``mqd table`` holds the lock."""
    from mqd.spark.table_maintenance import TableBusy, job_lock

    try:
        with job_lock(config):
            return _run(config, once=once, master=master)
    except TableBusy as exc:
        _log.error("spark_table_busy", query=query_name(config), error=str(exc), exit_code=EXIT_SESSION)
        return EXIT_SESSION


def _start_problem(config: MqdConfig, url: str, log: Any) -> int | None:
    """The exit code (logged) when the job cannot start: the master's URL (``--master`` bypasses
    the config's check), the landing unreadable, the output a table of another format; None: go
    on. Files in the landing that no claim chain names are logged, not read."""
    problem = master_problem(url)
    if problem is not None:
        log.error("spark_master_invalid", master=url, error=problem)
        return 2
    code = _landing_problem(config, log)
    if code is not None:
        return code
    from mqd.spark.table_format import table_format_problem

    problem = table_format_problem(config)
    if problem is not None:
        log.error("spark_table_format", error=problem)
        return 2
    return None


def _landing_problem(config: MqdConfig, log: Any) -> int | None:
    """The exit code when the landing cannot be read at all (None: go on); files it holds that no
    claim chain names are logged, not read."""
    if is_object_landing(config):
        try:
            stray_keys = unlisted_objects(config)
        except MqdError as exc:
            log.error("landing_unreadable", dir=str(config.landing.dir), error=str(exc))
            return 1
        if stray_keys:
            log.warning(
                "landing_unlisted_files",
                count=len(stray_keys),
                files=stray_keys[:50],
                note="not in the manifest: the job reads only files the claim chains name",
            )
    else:
        landing = Path(config.landing.dir)
        if not landing.is_dir():
            log.error("landing_dir_missing", dir=str(landing))
            return 2
        stray = unlisted_files(landing)
        if stray:
            log.warning(
                "landing_unlisted_files",
                count=len(stray),
                files=[str(p) for p in stray[:50]],
                note="not in the manifest: Spark reads them if they are valid Parquet with the "
                "landing schema; a corrupt one fails the job",
            )
    return None


def _start_queries(
    config: MqdConfig,
    plan: list[Any],
    typed_sink: Any,
    iceberg_sinks: list[Any],
    started: list[Any],
    *,
    once: bool,
    log: Any,
) -> None:
    """Start each planned query (appended to ``started`` as it starts, so a stop reaches it): into
    the typed sink, or the table writer of the configured format."""
    for name, df, out, ckpt, parts in plan:
        if typed_sink is not None:
            writer = df.writeStream.queryName(name).foreachBatch(typed_sink)
        else:
            writer = _table_writer(
                config, df.writeStream.queryName(name), out, parts, name, ckpt, iceberg_sinks
            )
        writer = writer.option("checkpointLocation", str(ckpt))
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=config.spark.trigger_interval)
        )
        started.append(writer.start())
        log.info("spark_query_started", query=name, output=out, checkpoint=str(ckpt), once=once)


def _maintain_once(spark: Any, maintenance: Any, iceberg_sinks: list[Any]) -> None:
    """A --once run's table maintenance, after its queries ended, where it is due."""
    if maintenance is not None:
        maintenance.run_if_due(spark)
    if iceberg_sinks:
        from mqd.spark.iceberg_sink import maintain_if_due

        for sink in iceberg_sinks:
            maintain_if_due(sink)


def _prepare(spark: Any, config: MqdConfig, log: Any) -> tuple[list[Any], _Recorder] | None:
    """The planned queries and their lifecycle recorder, registered; None (logged) when the config,
    a checkpoint or a query name refuses the run (exit 2)."""
    try:
        plan = _queries(spark, config)
    except SparkJobError as exc:
        log.error("spark_job_config", error=str(exc))
        return None
    mismatch = _checkpoint_mismatch(spark, config, plan)
    if mismatch is not None:
        log.error("spark_checkpoint_mismatch", error=mismatch)
        return None
    recorder = _Recorder(config, [(name, ckpt) for name, _df, _out, ckpt, _parts in plan])
    try:
        recorder.register()  # before any query runs: from now on each holds its files back
    except MqdError as exc:
        log.error("lifecycle_query_name_taken", error=str(exc))
        return None
    return plan, recorder


def _start_streaming_threads(
    spark: Any, recorder: _Recorder, maintenance: Any, stopping: threading.Event
) -> None:
    """A streaming run's lifecycle recorder and table maintenance, between batches, until ``stopping``."""
    threading.Thread(target=recorder.run, args=(stopping,), name="mqd-lifecycle", daemon=True).start()
    if maintenance is not None:
        threading.Thread(
            target=_maintain, args=(maintenance, spark, stopping), name="mqd-maintenance", daemon=True
        ).start()


def _run(config: MqdConfig, *, once: bool, master: str | None = None) -> int:
    """Run the job. ``once``: process what is in the landing directory (availableNow) and return;
    otherwise run until SIGTERM/SIGINT. Returns a process exit code (0 ok, 1 query failed,
    2 bad configuration, 75 no Spark session: EXIT_SESSION)."""
    log = _log.bind(query=query_name(config))
    url = master or config.spark.master
    code = _start_problem(config, url, log)
    if code is not None:
        return code
    had_session = _session_running()
    if is_object_landing(config):
        python_workers(url)
    try:
        spark = open_session(config, master)
    except SessionError as exc:
        log.error(
            "spark_session_failed",
            master=url,
            error=str(exc),
            exit_code=EXIT_SESSION,
            action="start or fix the Spark master (spark.master / --master); the job is retried",
        )
        return EXIT_SESSION
    started: list[Any] = []
    from mqd.spark.job_metrics import FILE_NAME, JobMetrics

    metrics = JobMetrics(Path(config.spark.checkpoint_dir) / FILE_NAME).load()
    batch_log = BatchLog(BATCH_METRICS, metrics)
    iceberg_sinks: list[Any] = []  # each maintains its table between its batches
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for q in started:
            q.stop()

    restore: list[tuple[signal.Signals, Any]] = []
    if not once and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            restore.append((sig, signal.signal(sig, _stop)))
    # partition expressions give null (the default partition) for a value they cannot parse, never
    # a failed batch that would fail again at every restart (mqd/spark/partitioning.py)
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        prepared = _prepare(spark, config, log)
        if prepared is None:
            return 2
        plan, recorder = prepared
        typed_sink = _typed_sink(spark, config, batch_log) if is_typed(config) else None
        _start_queries(config, plan, typed_sink, iceberg_sinks, started, once=once, log=log)
        maintenance = _maintenance(config, plan)
        # a --once run too: Spark keeps the progress of the last 100 batches only
        polled = [] if typed_sink is not None else started  # a typed sink logs its own batches
        threading.Thread(
            target=_log_batches, args=(batch_log, polled, stopping), name="mqd-batch-log", daemon=True
        ).start()
        if not once:
            _start_streaming_threads(spark, recorder, maintenance, stopping)
        for q in started:
            q.awaitTermination()
            if q.exception() is not None and not stopping.is_set():
                _log_failure(log, q.name, str(q.exception()))
                return 1
        stopping.set()  # the queries are done: no new maintenance round beside what follows
        recorder.record()
        batch_log.poll(polled)
        if once:  # a streaming run's threads did it between batches
            _maintain_once(spark, maintenance, iceberg_sinks)
        for q in started:
            progress = q.lastProgress or {}
            log.info(
                "spark_query_done",
                query=q.name,
                batch=progress.get("batchId"),
                rows=progress.get("numInputRows"),
            )
        return 0
    except Exception as exc:
        if stopping.is_set():
            return 0
        _log_failure(log, None, str(exc))
        return 1
    finally:
        stopping.set()  # ends the lifecycle recorder thread
        for q in started:
            if q.isActive:
                q.stop()
        for sig, handler in restore:
            signal.signal(sig, handler)
        if not had_session:
            spark.stop()


def _checkpoint_mismatch(
    spark: Any, config: MqdConfig, plan: list[tuple[str, Any, str, Path, list[str]]]
) -> str | None:
    """A query whose table is ahead of its checkpoint, or written by another query
    (mqd/spark/checkpoint_guard.py): refused before anything runs or is recorded."""
    from mqd.spark import checkpoint_guard

    fmt = config.spark.table_format
    if fmt == "iceberg" and config.spark.iceberg_catalog is not None:
        return None  # a catalog with a server: its table is not a folder to read here
    for _name, _df, out, ckpt, _parts in plan:
        writer = checkpoint_guard.table_writer(spark, fmt, out, iceberg_file_io(config))
        found = checkpoint_guard.problem(out, ckpt, writer)
        if found is not None:
            return found
    return None


def _table_writer(
    config: MqdConfig, writer: Any, out: str, parts: list[str], name: str, checkpoint: Path, sinks: list[Any]
) -> Any:
    """The query's sink for ``spark.table_format``: Delta's or Spark's file sink, or, for Iceberg,
    ``foreachBatch`` into pyiceberg in this driver (no Iceberg runtime exists for Spark 4.2), which
    also maintains the table between batches (its schedule's clock in the query's checkpoint);
    an Iceberg sink is added to ``sinks``."""
    fmt = config.spark.table_format
    if fmt == "iceberg":
        from mqd.spark.iceberg_sink import IcebergSink, foreach_batch
        from mqd.spark.table_maintenance import MaintenanceSchedule

        sink = IcebergSink(
            out,
            partition_by=parts,
            catalog=config.spark.iceberg_catalog,
            query_name=name,
            file_io=iceberg_file_io(config),
            maintenance=MaintenanceSchedule(config, [out], stamp_dir=checkpoint),
        )
        sinks.append(sink)
        return writer.foreachBatch(foreach_batch(sink.start()))
    writer = writer.format(fmt).option("path", out).outputMode("append")
    if fmt == "delta":
        # columns the landing or the value schema gained since the table was made are added
        writer = writer.option("mergeSchema", "true")
    return writer.partitionBy(*parts) if parts else writer


def iceberg_file_io(config: MqdConfig) -> dict[str, str]:
    """pyiceberg's FileIO properties for the job's tables: S3's when they live on S3."""
    sc = config.spark
    if not any(isinstance(p, str) for p in (sc.output_dir, sc.quarantine_dir)):
        return {}
    from mqd.spark.iceberg_catalog import s3_properties
    from mqd.spark.session import table_s3

    return s3_properties(*table_s3(config))


def _maintenance(config: MqdConfig, plan: list[tuple[str, Any, str, Path, list[str]]]) -> Any:
    """The Delta tables' maintenance schedule (None for a parquet table): every query's table, and
    the typed sink's dead-letter table, which no query of its own writes."""
    if config.spark.table_format != "delta":
        return None
    from mqd.spark.table_maintenance import MaintenanceSchedule

    tables = [out for _name, _df, out, _ckpt, _parts in plan]
    if is_typed(config):
        tables.append(_table_location("delta", config.spark.quarantine_dir))
    return MaintenanceSchedule(config, tables)


def _log_batches(batch_log: BatchLog, queries: list[Any], stopping: threading.Event) -> None:
    while not stopping.wait(BATCH_LOG_INTERVAL_S):
        try:
            batch_log.poll(queries)
        except Exception as exc:  # a py4j error of a query that just stopped: logged, never fatal
            _log.debug("spark_batch_log_failed", error=str(exc))


def _maintain(schedule: Any, spark: Any, stopping: threading.Event) -> None:
    """Beside the running queries, in the job's own driver: the one writer of the table's log."""
    while not stopping.wait(RECORD_INTERVAL_S):
        schedule.run_if_due(spark)


def unreadable_file(error: str) -> str | None:
    """The file a Spark failure names as unreadable, if it names one."""
    m = _FAILED_FILE.search(error)
    return m.group(1) if m else None


def _log_failure(log: Any, query: str | None, error: str) -> None:
    at = {} if query is None else {"query": query}  # else the bound main query's name
    path = unreadable_file(error)
    if path is not None:
        # nothing of the file is skipped: the job stops at it, every run, until it is dealt with
        log.error(
            "spark_unreadable_file",
            **at,
            file=path,
            action="repair or restore the file, or move it out of the landing directory if mqd did "
            "not publish it (mqd spark lists such files at start); the checkpoint resumes there",
            error=error[:2000],
        )
    elif query is not None:
        log.error("spark_query_failed", **at, error=error)
    else:
        log.error("spark_job_failed", error=error)


def _session_running() -> bool:
    """A SparkContext already runs in this process (the caller's): ``run`` must not stop it.
    Not ``SparkSession.getActiveSession()``: that is per thread (the JVM's active session is a
    thread-local), so ``run`` called from another thread took the caller's session for its own
    and stopped it at the end."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


__all__ = [
    "EXIT_SESSION",
    "LANDING_DDL",
    "RAW_TIMESTAMP_COLUMN",
    "SparkJobError",
    "build_session",
    "is_object_landing",
    "output_columns",
    "python_workers",
    "query_name",
    "run",
    "unlisted_files",
    "unlisted_objects",
    "unreadable_file",
]
