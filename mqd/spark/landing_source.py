"""The Spark job's source for an object-storage landing (``landing.dir = "s3://bucket/prefix"``).

Spark's file source would list the prefix (S3A, from the job's packages, could): a listing also
shows objects no claim names and files past a broken link, and knows no order. This is a Spark 4
Python streaming data source (``pyspark.sql.datasource``) that reads the landing through mqd's own
store code (store.py over s3_objects.py, boto3: the same endpoint, region and credentials as the
daemon), so what Spark reads is decided by the claim chain, never by a listing:

- The offset is one number per partition chain: ``{"<topic>/<partition>": n}``, the first ``n``
  files of the chain's manifest (``LandingStore.manifest()``: archived claims, then live claims, void
  records and the claims they void left out) have been read. Only the newest claim of a chain can be
  unresolved (claim ``k + 1`` is written only by someone who saw ``k``'s file visible), and a claim
  whose file is visible is never voided, so a prefix whose last file is visible never changes:
  the count is a stable position. ``latestOffset`` stops before a newest claim whose file is not
  visible yet (it may still be voided); staged objects (``_staging/``) are never listed.
- ``partitions`` packs the new files into Spark input partitions by Spark's own rule for its file
  source (``spark.sql.files.maxPartitionBytes``, ``openCostInBytes``, ``minPartitionNum`` or the
  default parallelism: ``pack``), in chain order: a task per file made a landing of thousands of
  small files cost a Python task each (0.14 s a file on 2 cores). ``read`` (on executors) fetches
  the partition's files a few at a time ahead of the one it decodes (``fetched``), and yields each
  file's Arrow record batches in the job's source schema (source_schema.py: the
  landing's columns, ``timestamp`` as epoch-ms BIGINT, ``dt``/``hour`` from the folder names as the
  file source adds them) plus the file's URI in ``_mqd_source_file`` (the quarantine's
  ``source_file``). A file that cannot be read fails the query, naming the file: never skipped.
- Exactly once across restarts comes from Spark's checkpoint of these offsets (the sink's
  ``_spark_metadata`` log does the rest, as with the file source). ``maxFilesPerTrigger`` is the
  default read limit, spread round-robin over the chains; ``availableNow`` reads up to the heads
  seen when the query started.
- ``commit`` does nothing: the landing's lifecycle (mqd/landing/lifecycle.py) learns what the query
  committed from its checkpoint instead (the offset of the last batch in ``commits/``), the same way
  for this source and Spark's file source, and under the query's name, which this reader does not
  know. Deleting a committed file does not move these offsets: the manifest keeps listing it.

The driver reads the chains read-only and incrementally (mqd/landing/chain_reader.py): it never
writes to the landing (read-only credentials suffice), a newest claim whose promotion is not done
yet is not shown (the publisher or the next writer completes it), and each trigger lists and reads
only the claims after the last one it read (one floor GET and one LIST per chain, one GET per new
claim, one HEAD per chain with a new newest claim).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import structlog
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mqd.landing.chain_reader import ChainReader
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.landing.read_ahead import SharedPool, read_ahead
from mqd.landing.s3_objects import S3Objects
from mqd.landing.schema import LANDING_SCHEMA
from mqd.spark.source_schema import SOURCE_FILE_COLUMN, source_ddl

_log = structlog.get_logger("mqd.spark")

SOURCE_NAME = "mqd_landing"  # spark.readStream.format(SOURCE_NAME) once registered
Offset = dict[str, int]  # "<topic>/<partition>" -> files of the chain's manifest read


def chain_id(topic: str, partition: int) -> str:
    """The offset's key of a partition chain (topic names have no '/': mqd.topic_name)."""
    return f"{topic}/{partition}"


# -- planning (pure) -------------------------------------------------------------------------------


def plan_end(start: Mapping[str, int], heads: Mapping[str, int], max_files: int | None) -> Offset:
    """The end offset of the next micro-batch: every chain moved towards its head, at most
    ``max_files`` new files in all (None: no limit), handed out one file per chain in turn so a
    busy partition does not starve the others. Chains absent from ``heads`` keep their start; a
    head below its start (a landing replaced under a checkpoint) never moves the offset back."""
    end: Offset = {k: max(v, start.get(k, 0)) for k, v in heads.items()}
    for k, v in start.items():
        end.setdefault(k, v)
    if max_files is None:
        return end
    budget = max(max_files, 1)
    pos = {k: start.get(k, 0) for k in end}
    while budget > 0:
        moved = False
        for k in sorted(end):
            if budget > 0 and pos[k] < end[k]:
                pos[k] += 1
                budget -= 1
                moved = True
        if not moved:
            break
    return pos


def new_files(
    start: Mapping[str, int], end: Mapping[str, int], chains: Mapping[str, Sequence[FileRange]]
) -> list[FileRange]:
    """The files of the micro-batch (``start``, ``end``], chain by chain in chain order. KeyError
    or IndexError-free: a chain shorter than ``end`` is an error (the planner saw more files)."""
    out: list[FileRange] = []
    for k in sorted(end):
        lo, hi = start.get(k, 0), end[k]
        files = chains.get(k, ())
        if hi > len(files):
            raise LandingSourceError(
                f"chain {k} lists {len(files)} files, the offset says {hi} were published: "
                "was the landing replaced under the job's checkpoint?"
            )
        out.extend(files[lo:hi])
    return out


@dataclass(frozen=True)
class Split:
    """Spark's file-splitting settings (``spark.sql.files.*``), which the file source applies too."""

    max_bytes: int = 128 * 1024 * 1024  # maxPartitionBytes
    open_cost: int = 4 * 1024 * 1024  # openCostInBytes: what opening a file costs, in bytes read
    min_partitions: int = 1  # minPartitionNum, or the default parallelism

    def to_options(self) -> dict[str, str]:
        return {
            "maxPartitionBytes": str(self.max_bytes),
            "openCostInBytes": str(self.open_cost),
            "minPartitions": str(self.min_partitions),
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Split:
        d = cls()
        return cls(
            int(options.get("maxPartitionBytes", d.max_bytes)),
            int(options.get("openCostInBytes", d.open_cost)),
            int(options.get("minPartitions", d.min_partitions)),
        )


def pack(files: Sequence[FileRange], split: Split) -> list[tuple[FileRange, ...]]:
    """The files in order, cut into input partitions as Spark's file source cuts its splits: each
    file costs its bytes plus the open cost, a partition holds at most ``min(max_bytes,
    max(open_cost, total / min_partitions))`` of cost (a file alone may exceed it). Every file is in
    exactly one partition, in the given order."""
    costs = [max(f.bytes, 0) + split.open_cost for f in files]
    target = min(split.max_bytes, max(split.open_cost, sum(costs) // max(split.min_partitions, 1)))
    out: list[tuple[FileRange, ...]] = []
    current: list[FileRange] = []
    size = 0
    for f, cost in zip(files, costs, strict=True):
        if current and size + cost > target:
            out.append(tuple(current))
            current, size = [], 0
        current.append(f)
        size += cost
    if current:
        out.append(tuple(current))
    return out


def hive_values(path: str) -> tuple[str, int]:
    """(dt, hour) of ``topic=t/dt=YYYY-MM-DD/hour=HH/part-...parquet``, as Spark's file source
    reads the folder names."""
    parts = dict(p.split("=", 1) for p in path.split("/")[:-1] if "=" in p)
    try:
        return parts["dt"], int(parts["hour"])
    except (KeyError, ValueError):
        raise LandingSourceError(f"{path}: not in a dt=/hour= folder") from None


class LandingSourceError(Exception):
    """The landing does not match the query's checkpoint, or a file cannot be read."""


# Spark's wording for a file its reader failed on, so job.unreadable_file() names the file in the
# log; kept off the raising line, which Spark's error repeats in its traceback
_UNREADABLE = "Error while reading file {}. {}"


def unreadable(uri: str, why: str) -> LandingSourceError:
    return LandingSourceError(_UNREADABLE.format(uri, why))


# -- the Arrow side --------------------------------------------------------------------------------


def _spark_arrow_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type of a column as the source hands it to Spark (source_schema.source_ddl)."""
    if pa.types.is_dictionary(t):
        return t.value_type
    if pa.types.is_timestamp(t):
        return pa.int64()  # epoch ms, clamped by the job
    return t


SOURCE_ARROW_SCHEMA = pa.schema(
    [
        *[pa.field(f.name, _spark_arrow_type(f.type)) for f in LANDING_SCHEMA],
        pa.field("dt", pa.string()),
        pa.field("hour", pa.int32()),
        pa.field(SOURCE_FILE_COLUMN, pa.string()),
    ]
)


def file_batches(data: bytes, path: str, uri: str) -> Iterator[pa.RecordBatch]:
    """A landed file's bytes as record batches of SOURCE_ARROW_SCHEMA; a column the file lacks
    (``incarnation`` in format-1 files) reads as null, as with the file source."""
    dt, hour = hive_values(path)
    table = pq.read_table(io.BytesIO(data))
    for batch in table.to_batches():
        n = batch.num_rows
        cols: list[pa.Array] = []
        for f in SOURCE_ARROW_SCHEMA:
            if f.name == "dt":
                cols.append(pa.array([dt] * n, pa.string()))
            elif f.name == "hour":
                cols.append(pa.array([hour] * n, pa.int32()))
            elif f.name == SOURCE_FILE_COLUMN:
                cols.append(pa.array([uri] * n, pa.string()))
            elif f.name in batch.schema.names:
                col = batch.column(f.name)
                if pa.types.is_dictionary(col.type):
                    col = col.dictionary_decode()
                if pa.types.is_timestamp(col.type):
                    col = col.cast(pa.timestamp("ms", tz=col.type.tz)).view(pa.int64())
                cols.append(col.cast(f.type))
            else:
                cols.append(pa.nulls(n, f.type))
        yield pa.RecordBatch.from_arrays(cols, schema=SOURCE_ARROW_SCHEMA)


# -- the data source -------------------------------------------------------------------------------

_objects_lock = threading.Lock()
_objects: dict[tuple[str, str, str], S3Objects] = {}


def _s3(options: Mapping[str, str]) -> S3Objects:
    """One S3Objects per (uri, endpoint, region) in this Python process: boto3 clients are costly
    to build and thread-safe; never pickled (each worker process builds its own)."""
    key = (options["uri"], options.get("endpoint_url", ""), options.get("region", ""))
    with _objects_lock:
        got = _objects.get(key)
        if got is None:
            got = S3Objects(key[0], endpoint_url=key[1] or None, region=key[2] or None)
            _objects[key] = got
        return got


@dataclass(frozen=True)
class LandedFile:
    path: str  # relative to the landing root
    bytes: int  # as its claim says (0: not recorded)


class LandingFiles(InputPartition):
    """One Spark input partition: visible landed files, read in this order."""

    def __init__(self, files: tuple[LandedFile, ...]) -> None:
        super().__init__(files)
        self.files = files


# what one task fetches ahead of the file it decodes: a few round trips of a store in flight, not
# a partition's bytes in memory
FETCH_AHEAD_FILES = 8
FETCH_AHEAD_BYTES = 64 * 1024 * 1024
_GET_POOL = SharedPool(FETCH_AHEAD_FILES, "mqd-landing-get")


def fetched(
    files: Sequence[LandedFile], get: Callable[[str], tuple[bytes, str] | None]
) -> Generator[tuple[LandedFile, tuple[bytes, str] | None], None, None]:
    """Each file with ``get(path)``, in order, with up to FETCH_AHEAD_FILES (and FETCH_AHEAD_BYTES,
    at least one file) fetched ahead on threads; stopping early cancels what was not started."""
    return read_ahead(
        files,
        lambda f: get(f.path),
        _GET_POOL.get(),
        window=FETCH_AHEAD_FILES,
        cost=lambda f: f.bytes,
        budget=FETCH_AHEAD_BYTES,
    )


class LandingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and plans from the claim chains; executor side: ``read``."""

    def __init__(self, options: Mapping[str, str], objects: Objects | None = None) -> None:
        self.options = dict(options)
        self.max_files = int(self.options.get("maxFilesPerTrigger", "0")) or None
        self.split = Split.from_options(self.options)
        self._given = objects  # tests hand their own client in
        self._reader: ChainReader | None = None  # driver side: where each chain's reading stopped
        self._chains: dict[str, list[FileRange]] = {}  # the last listing, for partitions()
        self._target: Offset | None = None  # availableNow: the heads when the query started

    def __getstate__(self) -> dict[str, Any]:
        # what executors need for read(): the options; clients and listings stay on the driver
        return {**self.__dict__, "_given": None, "_reader": None, "_chains": {}}

    def _objects(self) -> Objects:
        return self._given if self._given is not None else _s3(self.options)

    def list_chains(self) -> dict[str, list[FileRange]]:
        """Every chain's visible files in chain order (module docstring). Read-only."""
        if self._reader is None:
            self._reader = ChainReader(self._objects())
        chains = {chain_id(t, p): list(v.files) for (t, p), v in self._reader.refresh().items()}
        self._chains = chains
        return chains

    def heads(self) -> Offset:
        return {k: len(v) for k, v in self.list_chains().items()}

    def initialOffset(self) -> Offset:
        return {}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_files is None else ReadMaxFiles(self.max_files)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.heads()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        heads = self.heads()
        if self._target is not None:
            heads = {k: min(v, self._target.get(k, 0)) for k, v in heads.items()}
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        return plan_end(start, heads, max_files)

    def reportLatestOffset(self) -> Offset | None:
        return {k: len(v) for k, v in self._chains.items()} or None

    def partitions(self, start: Offset, end: Offset) -> Sequence[LandingFiles]:
        chains = self._chains
        if any(end[k] > len(chains.get(k, ())) for k in end):
            chains = self.list_chains()  # a restart: the plan was made by an earlier process
        packed = pack(new_files(start, end, chains), self.split)
        return [LandingFiles(tuple(LandedFile(r.path, max(r.bytes, 0)) for r in part)) for part in packed]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LandingFiles)
        objects = self._objects()
        for f, got in fetched(partition.files, objects.get):
            uri = f"{objects.location}/{f.path}"
            if got is None:
                raise unreadable(uri, "the landed file is missing")
            try:
                yield from file_batches(got[0], f.path, uri)
            except (pa.ArrowException, OSError) as exc:
                raise unreadable(uri, str(exc)) from None

    def commit(self, end: Offset) -> None:
        # the lifecycle reads the committed offsets from the checkpoint (module docstring)
        pass


class LandingSource(DataSource):
    """``spark.readStream.format("mqd_landing").option("uri", "s3://b/p")``; options
    ``endpoint_url``, ``region`` ([landing.s3]), ``maxFilesPerTrigger`` and Split's."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return f"{source_ddl()}, {SOURCE_FILE_COLUMN} STRING"

    def streamReader(self, schema: StructType) -> LandingStreamReader:
        return LandingStreamReader(self.options)


def session_split(spark: Any) -> Split:
    """The session's ``spark.sql.files.*`` settings, as its file source reads them (the parsed
    values of its SQL conf: ``"64m"`` and the like are Spark's to parse)."""
    try:
        conf = spark._jsparkSession.sessionState().conf()
    except AttributeError:  # Spark Connect: no JVM here; Spark's defaults
        return Split()
    min_num = conf.filesMinPartitionNum()  # a Scala Option
    return Split(
        int(conf.filesMaxPartitionBytes()),
        int(conf.filesOpenCostInBytes()),
        int(min_num.get()) if min_num.isDefined() else int(spark.sparkContext.defaultParallelism),
    )


def stream(spark: Any, uri: str, endpoint_url: str | None, region: str | None, max_files: int) -> Any:
    """The landing at ``uri`` as a streaming DataFrame of the source schema."""
    spark.dataSource.register(LandingSource)
    reader = (
        spark.readStream.format(SOURCE_NAME).option("uri", uri).options(**session_split(spark).to_options())
    )
    if endpoint_url:
        reader = reader.option("endpoint_url", endpoint_url)
    if region:
        reader = reader.option("region", region)
    return reader.option("maxFilesPerTrigger", str(max_files)).load()


__all__ = [
    "SOURCE_ARROW_SCHEMA",
    "SOURCE_NAME",
    "LandedFile",
    "LandingFiles",
    "LandingSource",
    "LandingSourceError",
    "LandingStreamReader",
    "Split",
    "chain_id",
    "fetched",
    "file_batches",
    "hive_values",
    "new_files",
    "pack",
    "plan_end",
    "session_split",
    "stream",
    "unreadable",
]
