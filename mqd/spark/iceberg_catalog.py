"""The Iceberg table's default catalog: its own folder, laid out like Iceberg's Hadoop catalog.

``metadata/v<N>.metadata.json`` is version N of the table, and a commit creates ``v<N+1>`` only if
that name is free (a create-only write: ``os.link`` on a local folder, the primitive of
mqd.landing.objects), so of two writers one wins and the other gets pyiceberg's
CommitFailedException with nothing written. ``metadata/version-hint.text`` names the newest version
after each commit (a hint: written after the commit, so it may lag for a moment; the loader looks
past it). So the folder alone is the table for every reader, as ``_delta_log`` is for Delta: DuckDB's
``iceberg_scan('<dir>')``, pyiceberg's ``StaticTable.from_metadata('<dir>')``, Polars' ``scan_iceberg``.
Used by mqd/spark/iceberg_sink.py unless ``spark.iceberg_catalog`` names another catalog.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import structlog
from pyiceberg.catalog import Catalog, MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate, update_table_metadata
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties
from pyiceberg.view import View

from mqd.errors import MqdError
from mqd.landing.errors import PreconditionFailed
from mqd.landing.objects import Objects

_log = structlog.get_logger("mqd.spark")

DEFAULT_NAMESPACE = "mqd"  # the namespace the one table is listed under
METADATA_DIR = "metadata"
VERSION_HINT = f"{METADATA_DIR}/version-hint.text"
DEFAULT_REGION = "us-east-1"  # S3's own default, when neither the config nor the AWS variables name one

_VERSION_FILE = re.compile(r"v(\d+)\.metadata\.json")


class IcebergSinkError(MqdError):
    """The sink cannot write the table as configured (a partition column missing from the data, a
    location it cannot hold yet). Not retriable."""

    retriable = False


def _metadata_key(version: int) -> str:
    return f"{METADATA_DIR}/v{version}.metadata.json"


def s3_properties(endpoint_url: str | None, region: str | None, path_style: bool) -> dict[str, str]:
    """pyiceberg's FileIO properties for a table on S3 (the data files go through pyarrow's S3
    filesystem). Credentials: the AWS chain, as for the landing. A region is always given: without
    one pyiceberg asks AWS where the bucket is, which a store that is not AWS cannot answer."""
    props = {
        "s3.region": region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
        "s3.force-virtual-addressing": "false" if path_style else "true",
    }
    if endpoint_url is not None:
        props["s3.endpoint"] = endpoint_url
    return props


def table_objects(location: str, properties: Mapping[str, str] | None = None) -> Objects:
    """The object primitives the folder catalog commits through, for a table at ``location``: a
    local folder, or ``s3://bucket/path`` (the landing's S3 objects: the same create-only put, with
    ``s3.endpoint`` and ``s3.region`` of ``properties``)."""
    if location.startswith("s3://"):
        from mqd.landing.s3_objects import S3Objects

        props = properties or {}
        return S3Objects(location, endpoint_url=props.get("s3.endpoint"), region=props.get("s3.region"))
    if "://" in location and not location.startswith("file://"):
        raise IcebergSinkError(f"an Iceberg table at {location}: give a local folder or an s3:// URI")
    from mqd.landing.local_objects import LocalObjects

    return LocalObjects(Path(location.removeprefix("file://")))


def is_iceberg_table(location: str | Path, properties: Mapping[str, str] | None = None) -> bool:
    """The folder (or ``s3://`` prefix) holds an Iceberg table of the folder catalog (a committed
    metadata version)."""
    if isinstance(location, str) and location.startswith("s3://"):
        objects = table_objects(location, properties)
        return any(
            _VERSION_FILE.fullmatch(info.key.rsplit("/", 1)[-1])
            for info in objects.list_objects(f"{METADATA_DIR}/v")
        )
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

    def __init__(
        self, location: str, objects: Objects | None = None, properties: Mapping[str, str] | None = None
    ) -> None:
        super().__init__("mqd", **(properties or {}))
        self.location = location.rstrip("/")
        self.objects = objects if objects is not None else table_objects(self.location, properties)

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


__all__ = [
    "DEFAULT_NAMESPACE",
    "METADATA_DIR",
    "VERSION_HINT",
    "FolderCatalog",
    "IcebergSinkError",
    "is_iceberg_table",
    "s3_properties",
    "table_objects",
]
