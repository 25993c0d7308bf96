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

Format version 2; identity partitions on the configured columns; schema evolution by name (a column
new in a batch is added to the table in the same commit as the batch; earlier rows read it as null).

No pyspark import: :func:`foreach_batch` only calls methods of the DataFrame Spark passes in.
pyiceberg is imported at module level: import this module only when the table format is iceberg.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import structlog
from pyiceberg.catalog import Catalog, MetastoreCatalog, PropertiesUpdateSummary, load_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate, update_table_metadata
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties, TableVersion
from pyiceberg.view import View

from mqd.errors import MqdError
from mqd.landing.objects import Objects, PreconditionFailed

_log = structlog.get_logger("mqd.spark")

QUERY_ID_PROPERTY = "mqd.query-id"  # snapshot summary: the streaming query that committed it
BATCH_ID_PROPERTY = "mqd.batch-id"  # snapshot summary: the query's batch it holds
FORMAT_VERSION: TableVersion = 2
# every table the sink makes or writes: commit retries off (module docstring)
TABLE_PROPERTIES = {"format-version": str(FORMAT_VERSION), "commit.retry.num-retries": "0"}
# tables of the folder catalog: a commit per batch makes a metadata file per batch; keep the last 100
FOLDER_TABLE_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}
DEFAULT_NAMESPACE = "mqd"
DEFAULT_PARTITION_BY = ("topic", "dt")
METADATA_DIR = "metadata"
VERSION_HINT = f"{METADATA_DIR}/version-hint.text"
# Spark sets it on the thread that runs a streaming batch; foreachBatch's function runs within it
SPARK_QUERY_ID_PROPERTY = "sql.streaming.queryId"

_VERSION_FILE = re.compile(r"v(\d+)\.metadata\.json")


class IcebergSinkError(MqdError):
    """The sink cannot write the table as configured (a partition column missing from the data, a
    location it cannot hold yet). Not retriable."""

    retriable = False


def _metadata_key(version: int) -> str:
    return f"{METADATA_DIR}/v{version}.metadata.json"


def table_objects(location: str) -> Objects:
    """The object primitives the folder catalog commits through, for a table at ``location``."""
    if "://" in location and not location.startswith("file://"):
        # s3:// is mqd.landing.s3_objects.S3Objects (the same create-only put) plus pyiceberg's S3
        # FileIO properties for the data files: not wired yet
        raise IcebergSinkError(f"an Iceberg table at {location} is not supported yet: give a local folder")
    from mqd.landing.local_objects import LocalObjects

    return LocalObjects(Path(location.removeprefix("file://")))


def is_iceberg_table(location: str | Path) -> bool:
    """The folder holds an Iceberg table of the folder catalog (a committed metadata version)."""
    meta = Path(location) / METADATA_DIR
    return meta.is_dir() and any(_VERSION_FILE.fullmatch(p.name) for p in meta.iterdir())


def _response(metadata: TableMetadata, location: str) -> CommitTableResponse:
    return CommitTableResponse.model_construct(metadata=metadata, metadata_location=location)


@dataclass(frozen=True)
class _Current:
    version: int
    metadata: TableMetadata


class FolderCatalog(MetastoreCatalog):
    """The one Iceberg table at ``location``, its folder its own catalog (module docstring). Every
    identifier names that table. ``objects`` (default: :func:`table_objects`) is where metadata
    files are read and created; data files go through pyiceberg's FileIO, chosen by ``location``."""

    def __init__(self, location: str, objects: Objects | None = None, **properties: str) -> None:
        super().__init__("mqd", **properties)
        self.location = location.rstrip("/")
        self.objects = objects if objects is not None else table_objects(self.location)

    # -- the table's versions ---------------------------------------------------------------------

    def metadata_location(self, version: int) -> str:
        return f"{self.location}/{_metadata_key(version)}"

    def _hinted_version(self) -> int | None:
        got = self.objects.get(VERSION_HINT)
        if got is None:
            return None
        text = got[0].decode("utf-8", "replace").strip()
        return int(text) if text.isdigit() else None

    def _listed_version(self) -> int | None:
        versions = [
            int(m.group(1))
            for info in self.objects.list_objects(f"{METADATA_DIR}/v")
            if (m := _VERSION_FILE.fullmatch(info.key.rsplit("/", 1)[-1]))
        ]
        return max(versions, default=None)

    def current_version(self) -> int | None:
        """The newest committed version: the hint's, or past it (a commit whose hint was not
        written yet); the listing when there is no usable hint. None: no table."""
        version = self._hinted_version()
        if version is None or self.objects.head(_metadata_key(version)) is None:
            version = self._listed_version()
        if version is None:
            return None
        while self.objects.head(_metadata_key(version + 1)) is not None:
            version += 1
        return version

    def _current(self) -> _Current | None:
        version = self.current_version()
        if version is None:
            return None
        got = self.objects.get(_metadata_key(version))
        if got is None:  # deleted under us (previous-versions-max): a newer one exists
            return self._current()
        return _Current(version, TableMetadataUtil.parse_raw(got[0].decode("utf-8")))

    def sync_hint(self) -> None:
        """Write ``version-hint.text`` if it lags behind the newest version (a writer that died
        between its commit and the hint), so readers that trust the hint see the whole table."""
        version = self.current_version()
        if version is not None and version != self._hinted_version():
            self._write_hint(version)

    def _write_hint(self, version: int) -> None:
        # no newline: pyiceberg's StaticTable reads the text as it is
        self.objects.put(VERSION_HINT, str(version).encode())

    def _table(self, identifier: str | Identifier, current: _Current) -> Table:
        location = self.metadata_location(current.version)
        return Table(
            identifier=Catalog.identifier_to_tuple(identifier),
            metadata=current.metadata,
            metadata_location=location,
            io=self._load_file_io(current.metadata.properties, location),
            catalog=self,
        )

    # -- tables -----------------------------------------------------------------------------------

    def load_table(self, identifier: str | Identifier) -> Table:
        current = self._current()
        if current is None:
            raise NoSuchTableError(f"no Iceberg table at {self.location}")
        return self._table(identifier, current)

    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | pa.Schema,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        txn = self.create_table_transaction(
            identifier, schema, location or self.location, partition_spec, sort_order, properties
        )
        try:
            txn.commit_transaction()
        except CommitFailedException as exc:
            raise TableAlreadyExistsError(f"an Iceberg table is at {self.location} already") from exc
        return self.load_table(identifier)

    def commit_table(
        self, table: Table, requirements: tuple[TableRequirement, ...], updates: tuple[TableUpdate, ...]
    ) -> CommitTableResponse:
        """Version N+1 from the newest version N and ``updates``, created only if no other writer
        created it first (CommitFailedException then: nothing written). A failure of the store
        itself (ObjectStoreError) leaves the outcome unknown: the file may have been created."""
        current = self._current()
        base = current.metadata if current is not None else None
        for requirement in requirements:
            requirement.validate(base)  # CommitFailedException when the table moved on
        updated = update_table_metadata(
            base_metadata=base if base is not None else self._empty_table_metadata(),
            updates=updates,
            enforce_validation=current is None,
            metadata_location=self.metadata_location(current.version) if current is not None else None,
        )
        if current is not None and updated == current.metadata:
            return _response(current.metadata, self.metadata_location(current.version))
        if updated.location.rstrip("/") != self.location:
            raise IcebergSinkError(f"the table's location {updated.location} is not {self.location}")
        version = current.version + 1 if current is not None else 1
        data = updated.model_dump_json(exclude_none=True).encode()
        try:
            self.objects.put(_metadata_key(version), data, if_absent=True)
        except PreconditionFailed:
            raise CommitFailedException(
                f"{self.location}: version {version} was committed by another writer"
            ) from None
        try:
            self._write_hint(version)
        except MqdError as exc:  # the commit stands; the next commit or sync_hint writes it
            _log.warning("iceberg_version_hint_failed", table=self.location, version=version, error=str(exc))
        return _response(updated, self.metadata_location(version))

    def register_table(
        self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False
    ) -> Table:
        raise NotImplementedError("the folder catalog holds the table at its location only")

    def drop_table(self, identifier: str | Identifier) -> None:
        raise NotImplementedError("delete the table's folder")

    def rename_table(self, from_identifier: str | Identifier, to_identifier: str | Identifier) -> Table:
        raise NotImplementedError("the folder catalog's table has no name but its folder")

    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        return [(DEFAULT_NAMESPACE, Path(self.location).name)] if self.current_version() is not None else []

    # -- namespaces and views: none -----------------------------------------------------------------

    def create_namespace(self, namespace: str | Identifier, properties: Properties = EMPTY_DICT) -> None:
        raise NamespaceAlreadyExistsError("the folder catalog has one namespace")

    def drop_namespace(self, namespace: str | Identifier) -> None:
        raise NotImplementedError("the folder catalog has one namespace")

    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        return [(DEFAULT_NAMESPACE,)]

    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        return {}

    def update_namespace_properties(
        self, namespace: str | Identifier, removals: set[str] | None = None, updates: Properties = EMPTY_DICT
    ) -> PropertiesUpdateSummary:
        raise NotImplementedError("the folder catalog's namespace has no properties")

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def load_view(self, identifier: str | Identifier) -> View:
        raise NotImplementedError("the folder catalog has no views")

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> View:
        raise NotImplementedError("the folder catalog has no views")

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    def drop_view(self, identifier: str | Identifier) -> None:
        raise NotImplementedError("the folder catalog has no views")


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
    ``partition_by``: identity partitions of a new table (an existing table keeps its own spec).
    ``schema``: of a new table; None: the first batch's. ``query_name``: for the logs."""

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
    ) -> None:
        self.location = str(location).rstrip("/")
        self.partition_by = list(partition_by)
        self.catalog_properties = dict(catalog) if isinstance(catalog, Mapping) else None
        self.identifier = (namespace, table_name or Path(self.location).name or "table")
        self.schema = schema
        self.query_name = query_name
        self._catalog: Catalog | None = catalog if isinstance(catalog, Catalog) else None
        self._table: Table | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            if self.catalog_properties is None:
                self._catalog = FolderCatalog(self.location)
            else:
                props = dict(self.catalog_properties)
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
        missing = [c for c in self.partition_by if c not in arrow_schema.names]
        if missing:
            raise IcebergSinkError(f"partition columns {missing} are not in the data: {arrow_schema.names}")
        schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema, FORMAT_VERSION))
        spec = PartitionSpec(
            *[
                PartitionField(
                    source_id=schema.find_field(name).field_id,
                    field_id=1000 + i,
                    transform=IdentityTransform(),
                    name=name,
                )
                for i, name in enumerate(self.partition_by)
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
        if spec != self.partition_by:
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

    return write


__all__ = [
    "BATCH_ID_PROPERTY",
    "FORMAT_VERSION",
    "QUERY_ID_PROPERTY",
    "TABLE_PROPERTIES",
    "FolderCatalog",
    "IcebergSink",
    "IcebergSinkError",
    "foreach_batch",
    "is_iceberg_table",
    "streaming_query_id",
    "table_objects",
    "table_schema",
]
