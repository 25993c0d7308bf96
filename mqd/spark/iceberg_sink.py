"""The Iceberg output of the Spark job: each micro-batch appended exactly once by pyiceberg, in the driver.

Maven Central has no Iceberg runtime for the job's Spark (4.2), so the table is not written through
Spark's JVM: the query's ``foreachBatch`` hands each micro-batch to :class:`IcebergSink` as Arrow
(``DataFrame.toArrow()``, collected on the driver), and pyiceberg writes the data files and commits
one snapshot per batch.

Exactly once: every snapshot the sink commits carries the streaming query's id and the batch id in
its summary (``mqd.query-id``, ``mqd.batch-id``). Spark re-runs a batch whose commit to the
checkpoint did not happen (a crash between the Iceberg commit and the checkpoint's), with the same
query id (kept in the checkpoint, stable across restarts) and the same batch id; the sink finds the
batch among the table's snapshots and skips it. pyiceberg's own commit retries are off (the table
property ``commit.retry.num-retries`` = 0): a commit that loses to another writer fails the batch,
and the restarted batch decides by the token, never by a blind second append. The data files of a
batch whose commit did not happen are in no snapshot: no Iceberg reader sees them.

The catalog: by default none with a server. The table folder is its own catalog, the way Iceberg's
Hadoop catalog lays it out: ``metadata/v<N>.metadata.json`` is version N, and a commit creates
``v<N+1>`` only if that name is free (a create-only write: ``os.link`` on a local folder,
``If-None-Match: *`` on S3, the primitives of mqd.landing.objects), so of two writers one wins and the
other gets pyiceberg's CommitFailedException with nothing written. ``metadata/version-hint.text``
names the newest version after each commit (a hint: written after the commit, so it may lag behind
for a moment; this module's loader looks past it). So the folder alone is the table for every reader
(like Delta's ``_delta_log``): DuckDB's ``iceberg_scan('<dir>')``, pyiceberg's
``StaticTable.from_metadata('<dir>')``, Polars' ``scan_iceberg``. A catalog with a server (REST, a
JDBC database through pyiceberg's SQL catalog, Glue, Hive) is chosen by passing its pyiceberg
properties (``{"type": "rest", "uri": ...}``).

Format version 2; partitioned by the configured columns (identity) and Iceberg's hidden transforms
(``days(timestamp)``, ``bucket(16, id)``: mqd/spark/partitioning.py); schema evolution by name (a column
new in a batch is added to the table in the same commit as the batch; earlier rows read it as null).

No pyspark import: :func:`foreach_batch` only calls methods of the DataFrame Spark passes in.
pyiceberg is imported at module level: import this module only when the table format is iceberg.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import (
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.typedef import TableVersion

from mqd.spark.iceberg_catalog import (
    DEFAULT_NAMESPACE,
    FolderCatalog,
    IcebergSinkError,
    is_iceberg_table,
)
from mqd.spark.iceberg_maintenance import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, maintain
from mqd.spark.partitioning import PartitionField as SparkPartitionField
from mqd.spark.partitioning import parse as parse_partition
from mqd.spark.table_maintenance import MaintenanceSchedule

_log = structlog.get_logger("mqd.spark")

FORMAT_VERSION: TableVersion = 2
# every table the sink makes or writes: commit retries off (module docstring)
TABLE_PROPERTIES = {"format-version": str(FORMAT_VERSION), "commit.retry.num-retries": "0"}
# tables of the folder catalog: a commit per batch makes a metadata file per batch; keep the last 100
FOLDER_TABLE_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
DEFAULT_PARTITION_BY = ("topic", "dt")
# Spark sets it on the thread that runs a streaming batch; foreachBatch's function runs within it
SPARK_QUERY_ID_PROPERTY = "sql.streaming.queryId"


def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([_nullable_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_large_list(t):
        return pa.large_list(_nullable_field(t.value_field))
    if pa.types.is_list(t):
        return pa.list_(_nullable_field(t.value_field))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _nullable_field(t.item_field))
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pa.timestamp(t.unit, "UTC")  # the same instants; Iceberg's timestamptz is UTC
    return t


def _nullable_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _nullable_type(f.type), nullable=True, metadata=f.metadata)


def table_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as the sink writes it: every field optional (a streaming table's columns come and
    go: a required column would refuse a later batch without it), zoned timestamps in UTC."""
    return pa.schema([_nullable_field(f) for f in schema], metadata=schema.metadata)


def _conform(batch: pa.Table) -> pa.Table:
    schema = table_schema(batch.schema)
    return batch if schema == batch.schema else batch.cast(schema)


class IcebergSink:
    """Appends a streaming query's micro-batches to one Iceberg table, each exactly once.

    ``location``: the table's folder (``spark.output_dir``). ``catalog``: pyiceberg catalog
    properties (``{"type": "rest", "uri": "http://...", "warehouse": ...}``, ``{"type": "sql",
    "uri": "postgresql+psycopg2://..."}``) or a pyiceberg Catalog; None: the folder catalog (no
    server). ``table_name`` and ``namespace`` name the table in such a catalog (default: the
    folder's name, in ``mqd``).
    ``partition_by``: the partition spec of a new table, as spark.partition_by entries (an existing
    table keeps its own spec).
    ``schema``: of a new table; None: the first batch's. ``query_name``: for the logs.
    ``file_io``: pyiceberg FileIO properties (a table on S3: iceberg_catalog.s3_properties).
    ``maintenance``: when to compact and expire (mqd/spark/iceberg_maintenance.py), between batches."""

    def __init__(
        self,
        location: str | Path,
        *,
        partition_by: Sequence[str] = DEFAULT_PARTITION_BY,
        catalog: Mapping[str, str] | Catalog | None = None,
        table_name: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        schema: pa.Schema | None = None,
        query_name: str | None = None,
        file_io: Mapping[str, str] | None = None,
        maintenance: MaintenanceSchedule | None = None,
    ) -> None:
        self.location = str(location).rstrip("/")
        self.partition_by = list(partition_by)
        self.catalog_properties = dict(catalog) if isinstance(catalog, Mapping) else None
        self.identifier = (namespace, table_name or Path(self.location).name or "table")
        self.schema = schema
        self.query_name = query_name
        self.file_io = dict(file_io or {})
        self.maintenance = maintenance
        self._catalog: Catalog | None = catalog if isinstance(catalog, Catalog) else None
        self._table: Table | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            if self.catalog_properties is None:
                self._catalog = FolderCatalog(self.location, properties=self.file_io)
            else:
                props = {**self.file_io, **self.catalog_properties}
                self._catalog = load_catalog(props.pop("name", "mqd"), **props)
        return self._catalog

    @property
    def table(self) -> Table:
        """The table (after :meth:`start` found or made it, or the first batch made it)."""
        if self._table is None:
            raise IcebergSinkError(f"the Iceberg table at {self.location} is not there yet: no batch made it")
        return self._table

    def start(self) -> IcebergSink:
        """Load the table, or create it when ``schema`` was given (else the first batch creates it).
        Commit retries are turned off on a table that has them on."""
        catalog = self.catalog
        if isinstance(catalog, FolderCatalog):
            catalog.sync_hint()
        try:
            table = catalog.load_table(self.identifier)
        except NoSuchTableError:
            if self.schema is None:
                return self
            table = self._create(self.schema)
        self._table = self._check(table)
        return self

    def _properties(self) -> dict[str, str]:
        extra = FOLDER_TABLE_PROPERTIES if isinstance(self.catalog, FolderCatalog) else {}
        return {**TABLE_PROPERTIES, **extra}

    def _create(self, arrow_schema: pa.Schema) -> Table:
        arrow_schema = table_schema(arrow_schema)
        fields = [parse_partition(entry) for entry in self.partition_by]
        missing = [f.source or f.name for f in fields if (f.source or f.name) not in arrow_schema.names]
        if missing:
            raise IcebergSinkError(f"partition columns {missing} are not in the data: {arrow_schema.names}")
        schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema, FORMAT_VERSION))
        spec = PartitionSpec(
            *[
                PartitionField(
                    source_id=schema.find_field(f.source or f.name).field_id,
                    field_id=1000 + i,
                    transform=_transform(f),
                    name=f.name,
                )
                for i, f in enumerate(fields)
            ]
        )
        catalog = self.catalog
        if not isinstance(catalog, FolderCatalog):
            catalog.create_namespace_if_not_exists(self.identifier[0])
        try:
            table = catalog.create_table(
                self.identifier,
                schema,
                location=self.location,
                partition_spec=spec,
                properties=self._properties(),
            )
        except TableAlreadyExistsError:
            table = catalog.load_table(self.identifier)
        _log.info(
            "iceberg_table_created",
            query=self.query_name,
            table=self.location,
            metadata=table.metadata_location,
            partition_by=self.partition_by,
        )
        return table

    def _check(self, table: Table) -> Table:
        if table.format_version < FORMAT_VERSION:
            raise IcebergSinkError(
                f"{table.metadata_location} is Iceberg format version {table.format_version}"
            )
        wanted = {k: v for k, v in self._properties().items() if k != "format-version"}
        if any(table.properties.get(k) != v for k, v in wanted.items()):
            with table.transaction() as txn:
                txn.set_properties(wanted)
        spec = [f.name for f in table.spec().fields]
        if spec != [parse_partition(entry).name for entry in self.partition_by]:
            _log.warning(
                "iceberg_partitioning_kept",
                query=self.query_name,
                table=self.location,
                table_partition_by=spec,
                configured=self.partition_by,
                note="an existing table keeps its partition spec",
            )
        return table

    def committed_batch(self, query_id: str) -> int | None:
        """The newest batch of ``query_id`` in the table's history (the current snapshot and its
        ancestors), None when that query committed none."""
        if self._table is None:
            return None
        meta = self._table.metadata
        for snapshot in ancestors_of(self._table.current_snapshot(), meta):
            summary = snapshot.summary
            if summary is not None and summary[QUERY_ID_PROPERTY] == query_id:
                batch = summary[BATCH_ID_PROPERTY]
                return int(batch) if batch is not None else None
        return None

    def write_batch(self, batch: pa.Table, query_id: str, batch_id: int) -> bool:
        """Append ``batch`` as batch ``batch_id`` of query ``query_id``, exactly once: False when the
        table already holds that batch or a later one of the query (a re-run), or when ``batch`` has
        no rows (nothing committed); True when this call committed it. A column new in ``batch``
        is added to the table in the same commit."""
        t0 = time.monotonic()
        if self._table is None:
            self.start()
        if self._table is None:
            self._table = self._check(self._create(batch.schema))
        else:
            self._table.refresh()  # another writer (maintenance) may have committed since
        log = _log.bind(query=self.query_name, query_id=query_id, batch=batch_id, table=self.location)
        done = self.committed_batch(query_id)
        if done is not None and done >= batch_id:
            log.info("iceberg_batch_skipped", committed_batch=done, rows=batch.num_rows)
            return False
        if batch.num_rows == 0:
            return False
        batch = _conform(batch)
        txn = self._table.transaction()
        with txn.update_schema() as update:
            update.union_by_name(batch.schema)  # no change when the table has every column already
        txn.append(batch, snapshot_properties={QUERY_ID_PROPERTY: query_id, BATCH_ID_PROPERTY: str(batch_id)})
        txn.commit_transaction()
        snapshot = self._table.current_snapshot()
        log.info(
            "iceberg_batch_committed",
            rows=batch.num_rows,
            snapshot=snapshot.snapshot_id if snapshot is not None else None,
            seconds=round(time.monotonic() - t0, 3),
        )
        return True


def maintain_if_due(sink: IcebergSink) -> bool:
    """Compact and expire the sink's table when its schedule says so (after a batch, in the batch's
    thread: no commit of the sink's own runs beside it)."""
    schedule = sink.maintenance
    if schedule is None or sink._table is None or not schedule.due():
        return False
    maintain(sink._table, schedule.target_bytes, schedule.retention_s, table_name=sink.location)
    schedule.done()
    return True


def _transform(field: SparkPartitionField) -> Transform[Any, Any]:
    """Iceberg's transform for a ``spark.partition_by`` entry (a column: identity)."""
    n = field.argument or 0
    kinds: dict[str | None, Callable[[], Transform[Any, Any]]] = {
        None: IdentityTransform,
        "identity": IdentityTransform,
        "year": YearTransform,
        "month": MonthTransform,
        "day": DayTransform,
        "hour": HourTransform,
        "bucket": lambda: BucketTransform(n),
        "trunc": lambda: TruncateTransform(n),
    }
    return kinds[field.transform]()


def iceberg_writer(location: str, file_io: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The newest (query id, batch id) token among the snapshots of the folder-catalog table at
    ``location`` (read only), None when no snapshot carries one (or there is no table)."""
    if not is_iceberg_table(location, file_io):
        return None
    catalog = FolderCatalog(location, properties=file_io)
    table = catalog.load_table((DEFAULT_NAMESPACE, Path(location).name))
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        query, batch = (summary[QUERY_ID_PROPERTY], summary[BATCH_ID_PROPERTY]) if summary else (None, None)
        if query is not None and batch is not None:
            return str(query), int(batch)
    return None


def streaming_query_id(df: Any) -> str:
    """The id of the streaming query running the batch ``df`` is of (inside ``foreachBatch``):
    Spark's, kept in the checkpoint's ``metadata`` file, the same across restarts."""
    query_id = df.sparkSession.sparkContext.getLocalProperty(SPARK_QUERY_ID_PROPERTY)
    if not query_id:
        raise IcebergSinkError(
            "no streaming query id: call the foreach_batch function from foreachBatch only"
        )
    return str(query_id)


def foreach_batch(sink: IcebergSink) -> Callable[[Any, int], None]:
    """The function for ``writeStream.foreachBatch``: each micro-batch, collected on the driver as
    Arrow, to ``sink.write_batch`` under the running query's id."""

    def write(df: Any, batch_id: int) -> None:
        sink.write_batch(df.toArrow(), streaming_query_id(df), int(batch_id))
        maintain_if_due(sink)

    return write


__all__ = [
    "BATCH_ID_PROPERTY",
    "FORMAT_VERSION",
    "QUERY_ID_PROPERTY",
    "TABLE_PROPERTIES",
    "IcebergSink",
    "foreach_batch",
    "iceberg_writer",
    "maintain_if_due",
    "streaming_query_id",
    "table_schema",
]
