"""Typed records: a landed key or value in the schema registry's wire format, decoded into the table's
columns by its writer schema (``spark.value_format`` / ``key_format`` = ``avro``).

Per micro-batch, on the driver: the batch's distinct schema ids (a scan of 5 bytes per record), each
new id's schema fetched once from the registry (mqd/spark/schema_registry.py), its Spark type
derived by Spark itself (``from_avro``'s analysis), merged into the table's type in id order
(mqd/spark/schema_evolution.py). Then one pass over the batch decodes every record: one ``CASE``
over the batch's ids, each branch ``from_avro`` with that id's writer schema, conformed to the
table's type (fields by name, missing ones null, promotions cast). No Python runs per record.

Where the decoded fields go: a value written with a record schema gives the record's fields as top
level columns; a field named like one of the table's own columns (``topic``, ``offset``,
``timestamp``...) is stored as ``value_<name>`` (logged once per schema id). A value of another
schema (a string, an array) is the column ``value``. A typed key is the column ``key``.

Protobuf (``protobuf``): each id's .proto and its imports compiled by protoc on the driver, each
message a record's message indexes select planned as the batch meets it (an id and a message path
per branch of the ``CASE``), decoded in Spark's JVM by mqd's own decoder (no spark-protobuf exists
for Spark 4): mqd/spark/protobuf_decode.py. A .proto protoc refuses and a recursive message are
``unsupported_schema``; a payload protobuf-java cannot parse is ``decode_failed``.

Every record ends in the table or in the dead-letter table (mqd/spark/dead_letters.py) with its
error class: ``not_wire_format``, ``unknown_schema`` (the registry answered 404 for its id),
``unsupported_schema`` (a Protobuf or JSON schema under ``avro``, or one Spark cannot read),
``decode_failed``, ``schema_incompatible`` (a field the table's column cannot take). A null key or
value (a tombstone) is no error: its columns are null. A registry that does not answer fails the
batch (retried by the job's restart): a record is never dead-lettered for a passing outage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from mqd.spark import dead_letters as dl
from mqd.spark import json_schema_types
from mqd.spark import wire_format as wire
from mqd.spark.schema_evolution import Misfit, conform, merge

_log = structlog.get_logger("mqd.spark")

Role = Literal["key", "value"]
Format = Literal["avro", "json_schema", "protobuf"]
# the registry's schemaType of each format
_REGISTRY_TYPE = {"avro": "AVRO", "json_schema": "JSON", "protobuf": "PROTOBUF"}
CORRUPT = "_mqd_corrupt"  # from_json's column for a document that does not parse as its schema


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """What the registry holds for one schema id: its type (``AVRO``, ``PROTOBUF``, ``JSON``) and text."""

    schema_id: int
    schema_type: str
    text: str
    references: tuple[tuple[str, str], ...] = ()  # (registered name, schema text): JSON, Protobuf


class SchemaNotFound(LookupError):
    """The registry answered that it has no schema with this id (its message attached)."""


# the registry lookup the decoder uses: the schema of an id, SchemaNotFound when there is none; any
# other exception (the registry unreachable) fails the batch
SchemaLookup = Callable[[int], WriterSchema]


@dataclass(slots=True)
class _Verdict:
    """One schema id's fate in this column: decoded (writer type and how its fields are named) or
    dead-lettered (class and message)."""

    schema_id: int
    text: str = ""
    writer: Any = None  # the Spark struct its records decode to, top-level fields renamed
    wrap: str | None = None  # a non-record schema: the one column it fills
    renames: dict[str, str] = field(default_factory=dict)  # record field -> column (clashes)
    null_record: bytes | None = None  # the Avro bytes of an all-null record, if one exists
    error_class: str | None = None
    message: str | None = None
    original: Any = None  # the Spark type of the writer schema as it is (before renames, unwrapped)


class ColumnDecoder:
    """Decodes one landed column (``key`` or ``value``) written in the registry's wire format into
    the table's columns. ``table_type`` is the struct of the columns it owns in the table (empty for
    a new table); ``reserved`` the table's other column names (a value field clashing with one is
    renamed)."""

    def __init__(
        self,
        spark: Any,
        role: Role,
        lookup: SchemaLookup,
        table_type: Any,
        reserved: Iterable[str],
        fmt: Format = "avro",
    ) -> None:
        self.spark = spark
        self.role = role
        self.fmt = fmt
        self.lookup = lookup
        self.table_type = table_type
        self.reserved = frozenset(reserved)
        self._verdicts: dict[int, _Verdict] = {}
        # protobuf: each id's compiled schema, and a verdict per (id, message-index path) met
        self._protobuf: dict[int, Any] = {}
        self._messages: dict[tuple[int, str], _Verdict] = {}
        self._session: Any = spark  # where the decoder's UDFs are registered: the batch's session

    # -- the driver's part, once per batch ----------------------------------------------------------

    def prepare(self, schema_ids: Iterable[int], batch: Any = None) -> list[str]:
        """Plan the ids not seen yet (registry fetch, Spark type, merge into the table's type), in id
        order. Returns the columns the table gains (for the batch's log line). ``batch`` (the
        micro-batch, with this decoder's column): protobuf plans each message a record's indexes
        select; without it only each id's first message ([0]) is planned."""
        from pyspark.sql.types import StructType

        before = {f.name for f in self.table_type.fields}
        for sid in sorted(set(schema_ids) - set(self._verdicts)):
            verdict = self._plan(sid)
            if verdict.writer is not None:
                assert isinstance(verdict.writer, StructType)
                try:
                    self.table_type = merge(self.table_type, verdict.writer)
                except Misfit as misfit:
                    verdict.error_class = dl.SCHEMA_INCOMPATIBLE
                    verdict.message = f"{self.role} schema id {sid}: {misfit}"
                    verdict.writer = None
            self._verdicts[sid] = verdict
            log = _log.bind(column=self.role, schema_id=sid)
            if verdict.error_class is not None:
                log.warning("typed_schema_refused", error_class=verdict.error_class, error=verdict.message)
            else:
                log.info("typed_schema_ready", renamed=verdict.renames or None)
        if self.fmt == "protobuf":
            self._prepare_messages(batch)
        return [f.name for f in self.table_type.fields if f.name not in before]

    def _prepare_messages(self, batch: Any) -> None:
        """Protobuf: a verdict for each (id, message path) of the batch not planned yet, each
        message's type merged into the table's type in (id, path) order."""
        from pyspark.sql import functions as F

        from mqd.spark import protobuf_decode as pb

        good = self.ids(good=True)
        if not good:
            return
        # foreachBatch hands each batch in a session of its own (a clone): the UDFs must be there
        self._session = self.spark if batch is None else batch.sparkSession
        pb.ensure_session(self._session)
        if batch is None:
            pairs = {(sid, "0") for sid in good}
        else:
            sid = wire.schema_id(F.col(self.role))
            found = (
                batch.select(sid.alias("sid"), pb.path_column(wire.payload(F.col(self.role))).alias("path"))
                .where(F.col("sid").isin(good) & F.col("path").isNotNull())
                .distinct()
                .collect()
            )
            pairs = {(int(r["sid"]), str(r["path"])) for r in found}
        for sid, path in sorted(pairs - set(self._messages)):
            schema = self._protobuf[sid]
            message = schema.messages.get(path)
            where = f"{self.role} schema id {sid}, message indexes [{path.replace('.', ', ')}]"
            if message is None:
                verdict = _Verdict(sid, error_class=dl.DECODE_FAILED, message=f"{where}: no such message")
            elif message.spark_type is None:
                verdict = _Verdict(
                    sid,
                    error_class=dl.UNSUPPORTED_SCHEMA,
                    message=f"{where} ({message.name}): {message.error}",
                )
            else:
                verdict = self._shape(sid, message.name, message.spark_type)
            if verdict.writer is not None:
                try:
                    self.table_type = merge(self.table_type, verdict.writer)
                except Misfit as misfit:
                    verdict.error_class = dl.SCHEMA_INCOMPATIBLE
                    verdict.message = f"{where}: {misfit}"
                    verdict.writer = None
            self._messages[(sid, path)] = verdict
            log = _log.bind(column=self.role, schema_id=sid, message_path=path)
            if verdict.error_class is not None:
                log.warning("typed_schema_refused", error_class=verdict.error_class, error=verdict.message)
            else:
                log.info("typed_message_ready", message=verdict.text, renamed=verdict.renames or None)

    def _plan(self, sid: int) -> _Verdict:
        try:
            schema = self.lookup(sid)
        except SchemaNotFound as exc:
            return _Verdict(sid, error_class=dl.UNKNOWN_SCHEMA, message=f"{self.role} schema id {sid}: {exc}")
        expected = _REGISTRY_TYPE[self.fmt]
        if schema.schema_type.upper() != expected:
            return _Verdict(
                sid,
                error_class=dl.UNSUPPORTED_SCHEMA,
                message=f"{self.role} schema id {sid} is a {schema.schema_type} schema, not {expected} "
                f"({self.role}_format = {self.fmt!r})",
            )
        if self.fmt == "protobuf":
            return self._plan_protobuf(sid, schema)
        try:
            if self.fmt == "avro":
                spark_type = avro_spark_type(self.spark, schema.text)
            else:
                spark_type = json_schema_types.spark_type(schema.text, dict(schema.references))
        except Exception as exc:  # Spark's parse and conversion errors, JsonSchemaError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return _Verdict(
                sid,
                error_class=dl.UNSUPPORTED_SCHEMA,
                message=f"{self.role} schema id {sid}: Spark cannot read it: {first[:500]}",
            )
        return self._shape(sid, schema.text, spark_type)

    def _plan_protobuf(self, sid: int, schema: WriterSchema) -> _Verdict:
        """The id's schema compiled by protoc with its imports (a schema protoc refuses is
        unsupported, with protoc's message); its messages are planned as records select them."""
        from mqd.spark import protobuf_decode as pb
        from mqd.spark.protobuf_tools import ProtocError

        try:
            self._protobuf[sid] = pb.plan_schema(schema.text, schema.references)
        except ProtocError as exc:
            return _Verdict(
                sid,
                error_class=dl.UNSUPPORTED_SCHEMA,
                message=f"{self.role} schema id {sid}: protoc refuses it: {exc}",
            )
        return _Verdict(sid, schema.text)

    def _shape(self, sid: int, text: str, spark_type: Any) -> _Verdict:
        """The verdict of a readable schema: a value record's fields are columns (renamed on a
        clash); anything else fills one column named after the role."""
        from pyspark.sql.types import StructField, StructType

        if self.role == "value" and isinstance(spark_type, StructType):
            renames = {f.name: f"value_{f.name}" for f in spark_type.fields if f.name in self.reserved}
            names = [renames.get(f.name, f.name) for f in spark_type.fields]
            if len(set(names)) != len(names):
                return _Verdict(
                    sid,
                    error_class=dl.SCHEMA_INCOMPATIBLE,
                    message=f"value schema id {sid}: renaming {sorted(renames)} to value_<name> "
                    "clashes with another of its fields",
                )
            writer = StructType(
                [StructField(n, f.dataType, True) for n, f in zip(names, spark_type.fields, strict=True)]
            )
            null_record = wire.avro_null_record(text) if self.fmt == "avro" else None
            return _Verdict(sid, text, writer, None, renames, null_record, original=spark_type)
        wrap = self.role
        writer = StructType([StructField(wrap, spark_type, True)])
        return _Verdict(sid, text, writer, wrap, {}, None, original=spark_type)

    # -- the expressions, evaluated per record in one pass --------------------------------------------

    def ids(self, good: bool) -> list[int]:
        return sorted(s for s, v in self._verdicts.items() if (v.error_class is None) == good)

    def _branches(self, sid_col: Any) -> list[tuple[Any, str, _Verdict, Any]]:
        """(condition, raw column name, verdict, plan key) of each decodable branch: an id (a
        Protobuf id and message path)."""
        from pyspark.sql import functions as F

        if self.fmt != "protobuf":
            return [
                (sid_col == sid, f"_{self.role}_raw_{sid}", self._verdicts[sid], sid)
                for sid in self.ids(good=True)
            ]
        from mqd.spark import protobuf_decode as pb

        path = pb.path_column(wire.payload(F.col(self.role)))
        planned = sorted(k for k, v in self._messages.items() if v.error_class is None)
        return [
            (
                (sid_col == sid) & (path == p),
                f"_{self.role}_raw_{sid}_{'_'.join(map(str, p))}",
                self._messages[(sid, p)],
                (sid, p),
            )
            for sid, p in planned
        ]

    def raw_columns(self, sid_col: Any) -> dict[str, Any]:
        """Each branch's record decoded by its writer schema, in a column of its own (null for
        other records). Added to the batch before :meth:`decoded`: the failure check and ``conform``
        read each decoded field, and over a column that reads the decode's result; over the
        decoding expression itself each read would decode the record again (Spark shares a
        repeated expression only where every row evaluates it, not in a CASE branch), which
        halved the rate at two schema ids and overflowed code generation at fifty (make bench)."""
        from pyspark.sql import functions as F

        data = wire.payload(F.col(self.role))
        return {
            name: F.when(cond, self._decode_expr(data, v, key))
            for cond, name, v, key in self._branches(sid_col)
        }

    def decoded(self, sid_col: Any) -> Any:
        """The table-typed struct of each record of a decodable id; null for the rest, and for a
        record its writer schema cannot decode. Reads the columns of :meth:`raw_columns`."""
        from pyspark.sql import functions as F

        data = wire.payload(F.col(self.role))
        out = F.lit(None).cast(self.table_type)
        for cond, name, v, _key in self._branches(sid_col):
            d, failed = self._result(F.col(name), data, v)
            if v.wrap is not None:
                shaped = F.struct(d.alias(v.wrap))
            elif self.fmt != "json_schema" and not v.renames:
                shaped = d  # already the writer's struct, field for field
            else:
                originals = {new: old for old, new in v.renames.items()}
                shaped = F.struct(*[d.getField(originals.get(n, n)).alias(n) for n in v.writer.fieldNames()])
            branch = F.when(failed, F.lit(None).cast(self.table_type)).otherwise(
                conform(shaped, v.writer, self.table_type)
            )
            out = F.when(cond, branch).otherwise(out)
        return out

    def keeps_extra(self) -> bool:
        """A JSON Schema value: its documents may carry properties the schema does not declare
        (``additionalProperties`` is true unless the schema says otherwise), kept by :meth:`extra`."""
        return self.fmt == "json_schema" and self.role == "value"

    def extra(self, sid_col: Any) -> Any:
        """Each object document's properties its writer schema does not declare, as a JSON object
        (mqd/spark/extra_fields.py); null when there are none or for other records."""
        from pyspark.sql import functions as F

        from mqd.spark.extra_fields import extra_fields

        text = wire.payload(F.col(self.role)).cast("string")
        out = F.lit(None).cast("string")
        for cond, _name, v, _key in self._branches(sid_col):
            if v.wrap is None:
                out = F.when(cond, extra_fields(text, list(v.original.fieldNames()))).otherwise(out)
        return out

    def _decode_expr(self, data: Any, v: _Verdict, key: Any) -> Any:
        """The expression decoding ``data`` by one branch's writer schema (a struct in the writer's
        own shape; JSON Schema's with the corrupt-record column)."""
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro
        from pyspark.sql.types import StringType, StructField, StructType

        if self.fmt == "protobuf":
            from mqd.spark import protobuf_decode as pb

            sid, p = key
            schema = self._protobuf[sid]
            return pb.decode_column(
                self._session, data, pb.function_name(self.role, sid, p), schema, schema.messages[p]
            )
        if self.fmt == "json_schema":
            text = data.cast("string")
            options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            if v.wrap is None:
                fields = list(v.original.fields)
                return F.from_json(text, StructType([*fields, StructField(CORRUPT, StringType())]), options)
            # a document that is not an object: parsed as the one field of an object around it
            around = StructType([StructField("v", v.original, True), StructField(CORRUPT, StringType())])
            return F.from_json(F.concat(F.lit('{"v":'), text, F.lit("}")), around, options)
        return from_avro(data, v.text, {"mode": "PERMISSIVE"})

    def _result(self, raw: Any, data: Any, v: _Verdict) -> tuple[Any, Any]:
        """(the decoded value, whether decoding failed) from a branch's raw column."""
        from pyspark.sql import functions as F

        if self.fmt == "protobuf":
            return raw, raw.isNull()
        if self.fmt == "json_schema":
            failed = raw.isNull() | raw.getField(CORRUPT).isNotNull()
            return (raw if v.wrap is None else raw.getField("v")), failed
        if v.wrap is not None:
            # a failed primitive decodes to null; a null of a nullable schema is a record too
            return raw, raw.isNull() & F.lit(not _nullable_avro(v.text))
        # PERMISSIVE answers a payload it cannot decode with a struct of nulls: a failure unless
        # the payload is the encoding of the all-null record
        all_null = F.lit(True)
        for f in v.original.fields:
            all_null = all_null & raw.getField(f.name).isNull()
        legit = data == F.lit(v.null_record) if v.null_record is not None else F.lit(False)
        return raw, all_null & ~legit

    def reason(self, sid_col: Any, decoded_col: Any) -> tuple[Any, Any]:
        """(error class, message) of each record's column, both null when it decoded (or is null)."""
        from pyspark.sql import functions as F

        source = F.col(self.role)
        cls = F.lit(None).cast("string")
        msg = F.lit(None).cast("string")
        for sid in self.ids(good=False):
            v = self._verdicts[sid]
            cls = F.when(sid_col == sid, F.lit(v.error_class)).otherwise(cls)
            msg = F.when(sid_col == sid, F.lit(v.message)).otherwise(msg)
        refused = sorted(k for k, v in self._messages.items() if v.error_class is not None)
        if refused:  # protobuf: a message its indexes select that cannot be a row of the table
            from mqd.spark import protobuf_decode as pb

            path = pb.path_column(wire.payload(source))
            for sid, p in refused:
                v = self._messages[(sid, p)]
                cls = F.when((sid_col == sid) & (path == p), F.lit(v.error_class)).otherwise(cls)
                msg = F.when((sid_col == sid) & (path == p), F.lit(v.message)).otherwise(msg)
        failed = source.isNotNull() & sid_col.isNotNull() & decoded_col.isNull()
        not_wire = source.isNotNull() & sid_col.isNull()
        cls = (
            F.when(not_wire, F.lit(dl.NOT_WIRE_FORMAT))
            .when(failed & cls.isNull(), F.lit(dl.DECODE_FAILED))
            .otherwise(cls)
        )
        msg = (
            F.when(not_wire, F.lit(f"{self.role}: {dl.ERROR_CLASSES[dl.NOT_WIRE_FORMAT]}"))
            .when(
                failed & msg.isNull(),
                F.concat(
                    F.lit(f"{self.role} schema id "),
                    sid_col.cast("string"),
                    F.lit(": the payload does not decode"),
                ),
            )
            .otherwise(msg)
        )
        return cls, msg


def registry_lookup(
    client: Any, retry_timeout: float = 0.0, clock: Callable[[], float] = time.monotonic
) -> SchemaLookup:
    """The decoder's lookup over a SchemaRegistryClient (mqd/spark/schema_registry.py, which caches
    each id): a 404 is SchemaNotFound (the record is dead-lettered); a registry that does not answer
    (every URL refused, timed out or 5xx: a retriable error) is waited for with backoff, a warning
    each try, up to ``retry_timeout`` seconds, then the error propagates (the batch fails, the job
    exits 1): an outage never dead-letters a record. Any other 4xx propagates at once. Avro
    references are inlined (``from_avro`` takes one schema); Protobuf's and JSON Schema's are kept by
    the name they are imported by."""
    from mqd.backoff import Backoff
    from mqd.spark.schema_registry import SchemaRegistryError

    def fetch(schema_id: int) -> Any:
        backoff = Backoff(0.5, 10.0)
        start = clock()
        while True:
            try:
                return client.schema(schema_id)
            except SchemaRegistryError as exc:
                if exc.status == 404:
                    raise SchemaNotFound(str(exc)) from None
                waited = clock() - start
                if not exc.retriable or waited >= retry_timeout:
                    raise
                delay = min(backoff.next(), max(0.0, retry_timeout - waited))
                _log.warning(
                    "schema_registry_unreachable",
                    schema_id=schema_id,
                    error=str(exc),
                    waited_s=round(waited, 1),
                    retry_in_s=round(delay, 2),
                    gives_up_after_s=retry_timeout,
                    note="the batch waits; nothing is dead-lettered for an outage",
                )
                time.sleep(delay)

    def lookup(schema_id: int) -> WriterSchema:
        found = fetch(schema_id)
        text = found.schema
        refs = tuple((r.name, r.schema) for r in found.referenced)
        if found.schema_type == "AVRO" and refs:
            text, refs = inline_avro_references(text, list(refs)), ()
        return WriterSchema(found.id, str(found.schema_type), text, refs)

    return lookup


def inline_avro_references(text: str, referenced: list[tuple[str, str]]) -> str:
    """``text`` with each referenced named type defined where the schema first names it (in Avro's
    parse order, depth first), the rest of its mentions left as names: one self-contained schema."""
    texts = dict(referenced)
    defined: set[str] = set()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            if node in texts and node not in defined:
                defined.add(node)
                return walk(json.loads(texts[node]))
            return node
        if isinstance(node, list):
            return [walk(n) for n in node]
        if isinstance(node, dict):
            if isinstance(node.get("name"), str):
                ns = node.get("namespace")
                defined.add(f"{ns}.{node['name']}" if ns and "." not in node["name"] else node["name"])
            return {k: walk(v) if k in ("type", "fields", "items", "values") else v for k, v in node.items()}
        return node

    return json.dumps(walk(json.loads(text)))


def avro_spark_type(spark: Any, schema_text: str) -> Any:
    """The Spark type ``from_avro`` decodes ``schema_text`` to (Spark's own conversion: enums as
    strings, unions as structs of members, logical types as dates, timestamps and decimals)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    probe = spark.range(0).select(from_avro(F.lit(None).cast("binary"), schema_text).alias("v"))
    return probe.schema["v"].dataType


def _nullable_avro(text: str) -> bool:
    try:
        schema = json.loads(text)
    except ValueError:
        return False
    return schema == "null" or (isinstance(schema, list) and "null" in schema)


__all__ = [
    "ColumnDecoder",
    "Format",
    "Role",
    "SchemaLookup",
    "SchemaNotFound",
    "WriterSchema",
    "avro_spark_type",
    "inline_avro_references",
    "registry_lookup",
]
