"""The job's sink for typed records (``value_format`` / ``key_format`` = ``avro`` or ``json_schema``):
one streaming query whose ``foreachBatch`` decodes each micro-batch (mqd/spark/typed_records.py)
and writes its rows to the output table and its dead letters to the dead-letter table, each exactly
once.

Exactly once across two tables: each write is keyed by the query's id and the batch id in the
table's own log (Delta's idempotent writes, ``txnAppId``/``txnVersion``; an Iceberg snapshot's
query and batch properties, mqd/spark/iceberg_sink.py). A batch re-run after a crash skips the table
that already holds it and writes the other. The table's columns grow as writer schemas add fields
(Delta's ``mergeSchema``, Iceberg's ``union_by_name``) without a restart; a restarted job reads the
columns back from the table, so a schema id is judged the same way after any restart.

A plain Parquet folder (``table_format = "parquet"``) has no log to key a write by: refused for
registry formats (config check says so).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from mqd.spark import dead_letters as dl
from mqd.spark import wire_format as wire
from mqd.spark.extra_fields import EXTRA_COLUMN
from mqd.spark.partitioning import PartitionField
from mqd.spark.typed_records import ColumnDecoder, Format, SchemaLookup

_log = structlog.get_logger("mqd.spark")

_EXTRA = "_value_extra"  # the batch's column of a JSON Schema value's undeclared properties
SOURCE_FILE = "_mqd_source_file"  # the landed file of each row, carried into the batch


class TypedSink:
    """Decodes and writes the batches of one query. ``envelope``: the landed columns the table keeps
    as they are (coordinates, timestamps, headers; ``key`` unless the key is typed too)."""

    def __init__(
        self,
        *,
        spark: Any,
        table_format: str,
        out: str,
        dead_letters: str,
        partitions: list[PartitionField],
        parts: list[str],
        dead_letter_parts: list[str],
        envelope: list[str],
        dead_letter_columns: list[str],
        value: tuple[SchemaLookup, Format] | None,
        key: tuple[SchemaLookup, Format] | None,
        query_name: str,
        iceberg: Callable[[str, list[str], str], Any] | None = None,
        on_batch: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.spark = spark
        self.table_format = table_format
        self.out = out
        self.dead_letters = dead_letters
        self.partitions = partitions
        self.parts = parts
        self.dead_letter_parts = dead_letter_parts
        self.envelope = envelope
        self.dead_letter_columns = dead_letter_columns
        self.query_name = query_name
        self._typed = {"value": value, "key": key}
        self._iceberg = iceberg
        self._sinks: dict[str, Any] = {}  # Iceberg: location -> IcebergSink
        self.on_batch = on_batch
        self.decoders: dict[str, ColumnDecoder] = {}

    def start(self) -> TypedSink:
        """Read the table's columns back (none for a new table) and build the column decoders."""
        from pyspark.sql.types import StructField, StructType

        existing = self._table_type()
        computed = {f.name for f in self.partitions if f.expression is not None}
        value, key = self._typed["value"], self._typed["key"]
        reserved = set(self.envelope) | computed | {"key", "value"}
        if value is not None and value[1] == "json_schema":
            reserved.add(
                EXTRA_COLUMN
            )  # the table's column of undeclared properties (a field of that name is renamed)
        if value is not None:
            owned = [f for f in existing.fields if f.name not in reserved or f.name == "value"]
            if any(f.name == "value" and f.dataType.typeName() == "binary" for f in owned):
                owned = [f for f in owned if f.name != "value"]
            self.decoders["value"] = ColumnDecoder(
                self.spark, "value", value[0], StructType(owned), reserved - {"value"}, value[1]
            )
        if key is not None:
            typed = [StructField(f.name, f.dataType, True) for f in existing.fields if f.name == "key"]
            typed = [f for f in typed if f.dataType.typeName() != "binary"]
            self.decoders["key"] = ColumnDecoder(self.spark, "key", key[0], StructType(typed), (), key[1])
        return self

    def _table_type(self) -> Any:
        from pyspark.sql.types import StructType

        if self.table_format == "delta":
            try:
                return self.spark.read.format("delta").load(self.out).schema
            except Exception:  # no table yet (Delta's own exception types through py4j)
                return StructType([])
        sink = self._iceberg_sink(self.out, self.parts)
        table = sink.table if sink._table is not None else None
        if table is None:
            return StructType([])
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(table.schema().as_arrow())

    def _iceberg_sink(self, location: str, parts: list[str]) -> Any:
        if location not in self._sinks:
            assert self._iceberg is not None
            self._sinks[location] = self._iceberg(location, parts, self.query_name).start()
        return self._sinks[location]

    # -- one batch ----------------------------------------------------------------------------------

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from mqd.spark.iceberg_sink import streaming_query_id

        t0 = time.monotonic()
        query_id = streaming_query_id(df)
        df = df.withColumns({f"_{r}_sid": wire.schema_id(F.col(r)) for r in self.decoders}).persist()
        try:
            ids = df.select(*[f"_{r}_sid" for r in self.decoders]).distinct().collect()
            new_columns: list[str] = []
            for r, dec in self.decoders.items():
                new_columns += dec.prepare(
                    (row[f"_{r}_sid"] for row in ids if row[f"_{r}_sid"] is not None), batch=df
                )
            # each record decoded once per column, then checked and conformed (ColumnDecoder.raw_columns)
            raw = {
                k: c
                for r, dec in self.decoders.items()
                for k, c in dec.raw_columns(F.col(f"_{r}_sid")).items()
            }
            staged = df.withColumns(raw).withColumns(
                {f"_{r}_dec": dec.decoded(F.col(f"_{r}_sid")) for r, dec in self.decoders.items()}
            )
            if self._keeps_extra():
                staged = staged.withColumn(_EXTRA, self.decoders["value"].extra(F.col("_value_sid")))
            foreign = F.col("partition").isNull() | F.col("offset").isNull()
            cls = F.when(foreign, F.lit(dl.FOREIGN_FILE))
            msg = F.when(foreign, F.lit(dl.ERROR_CLASSES[dl.FOREIGN_FILE]))
            sid = F.lit(None).cast("long")
            for r, dec in self.decoders.items():
                c, m = dec.reason(F.col(f"_{r}_sid"), F.col(f"_{r}_dec"))
                cls = cls.when(c.isNotNull(), c)
                msg = msg.when(c.isNotNull(), m)
                sid = F.coalesce(sid, F.col(f"_{r}_sid"))
            staged = staged.withColumns({"_reason": cls, "_message": msg, "_sid": sid}).persist()
            try:
                # rows per outcome in one pass: the good ones (no reason) and each dead-letter class
                extra = F.count(_EXTRA) if self._keeps_extra() else F.lit(0)
                outcomes = staged.groupBy("_reason").agg(F.count(F.lit(1)), extra).collect()
                counts = {r[0]: int(r[1]) for r in outcomes}
                extra_rows = sum(int(r[2]) for r in outcomes if r[0] is None)
                dead = {k: v for k, v in counts.items() if k is not None}
                good, bad = self._split(staged)
                written = self._write(good, counts.get(None, 0), self.out, self.parts, query_id, batch_id)
                if dead:
                    self._write(
                        bad, sum(dead.values()), self.dead_letters, self.dead_letter_parts, query_id, batch_id
                    )
            finally:
                staged.unpersist()
        finally:
            df.unpersist()
        self._maintain_iceberg()
        figures: dict[str, Any] = {
            "query": self.query_name,
            "batch": batch_id,
            "rows_in": written + sum(dead.values()),
            "rows_out": written,
            "seconds": round(time.monotonic() - t0, 3),
            **{f"dead_letter_{k}": v for k, v in dead.items()},
        }
        if self._keeps_extra():
            figures["extra_field_rows"] = extra_rows
        if new_columns:
            figures["new_columns"] = new_columns
        if self.on_batch is not None:
            self.on_batch(figures)

    def _keeps_extra(self) -> bool:
        return "value" in self.decoders and self.decoders["value"].keeps_extra()

    def _maintain_iceberg(self) -> None:
        """Compact and expire each Iceberg table this sink writes when its schedule says so: after a
        batch, in the batch's thread, so no commit of the sink's own runs beside it."""
        from mqd.spark.iceberg_sink import maintain_if_due

        for sink in self._sinks.values():
            maintain_if_due(sink)

    def _split(self, staged: Any) -> tuple[Any, Any]:
        from pyspark.sql import functions as F

        keep = [c for c in self.envelope if not (c == "key" and "key" in self.decoders)]
        typed: list[Any] = []
        if "key" in self.decoders:
            typed.append(F.col("_key_dec.key").alias("key"))
        if "value" in self.decoders:
            typed += [
                F.col(f"_value_dec.{f.name}").alias(f.name) for f in self.decoders["value"].table_type.fields
            ]
        if self._keeps_extra():
            typed.append(F.col(_EXTRA).alias(EXTRA_COLUMN))
        good = staged.where(F.col("_reason").isNull()).select(*[F.col(c) for c in keep], *typed)
        for f in self.partitions:
            if f.expression is not None:
                good = good.withColumn(f.name, F.expr(f.expression))
        bad = staged.where(F.col("_reason").isNotNull()).select(
            *[F.col(c) for c in self.dead_letter_columns],
            F.col("_reason").alias(dl.ERROR_CLASS_COLUMN),
            F.col("_message").alias(dl.ERROR_MESSAGE_COLUMN),
            F.col("_sid").cast("int").alias(dl.SCHEMA_ID_COLUMN),
            F.col(SOURCE_FILE).alias(dl.SOURCE_FILE_COLUMN),
            F.current_timestamp().alias(dl.DEAD_LETTERED_AT_COLUMN),
        )
        return good, bad

    def _write(self, df: Any, rows: int, out: str, parts: list[str], query_id: str, batch_id: int) -> int:
        """``df`` (``rows`` rows) appended to the table at ``out`` as batch ``batch_id`` of
        ``query_id``, once. The rows written (Iceberg: 0 when the table already had the batch)."""
        if self.table_format == "iceberg":
            batch = df.toArrow()
            done = self._iceberg_sink(out, parts).write_batch(batch, query_id, batch_id)
            return batch.num_rows if done else 0
        if rows == 0:
            return 0
        writer = (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", query_id)
            .option("txnVersion", batch_id)
            .option("mergeSchema", "true")
        )
        if parts:
            writer = writer.partitionBy(*parts)
        writer.save(out)
        return rows


__all__ = ["SOURCE_FILE", "TypedSink"]
