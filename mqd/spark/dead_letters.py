"""Dead letters: the records the job cannot turn into rows of the table, kept whole with the reason.

Every record the job reads ends in exactly one place: a row of the output table, or a row of the
dead-letter table (``spark.quarantine_dir``, same table format, written by its own query over the
same source with its own checkpoint; for registry formats, written by the same query in the same
batch, mqd/spark/typed_sink.py). A dead-letter row holds the record as it was landed (``key``,
``value``, ``headers``, its coordinates ``topic``/``partition``/``incarnation``/``offset``, the
timestamps), the file it was read from, when it was dead-lettered, and what happened:

``error_class`` is one of :data:`ERROR_CLASSES` (stable: alert on it, group by it),
``error_message`` says it for a person, ``schema_id`` is the registry schema id when the record
carried one (null otherwise).

A record with a null value (a Kafka tombstone) is not an error: it is a row of the table whose value
columns are null. Counted per class in the job's ``spark_batch_done`` line of the dead-letter query
and in the job's metrics file (mqd/spark/batch_log.py).

Pure names and messages: no pyspark import (the job builds the Spark expressions).
"""

from __future__ import annotations

FOREIGN_FILE = "foreign_file"  # a Parquet file in the landing that mqd did not write
NOT_JSON = "not_json"  # value_format = "json": the value is not a JSON object
SCHEMA_MISMATCH = "schema_mismatch"  # a JSON object whose fields do not fit value_schema

# value_format / key_format avro or json_schema (mqd/spark/typed_records.py); the message names the
# column (key or value) and, where there is one, the schema id and the registry's or Spark's words
NOT_WIRE_FORMAT = "not_wire_format"  # no magic byte 0 and 4-byte schema id in front
UNKNOWN_SCHEMA = "unknown_schema"  # the registry has no schema with the record's id
UNSUPPORTED_SCHEMA = "unsupported_schema"  # a schema of another type, or one Spark cannot read
DECODE_FAILED = "decode_failed"  # the payload does not decode with its writer schema
SCHEMA_INCOMPATIBLE = "schema_incompatible"  # the writer schema cannot be reconciled with the table

ERROR_CLASSES: dict[str, str] = {
    FOREIGN_FILE: "not an mqd landing record (a foreign file in the landing)",
    NOT_JSON: "value is not a JSON object",
    SCHEMA_MISMATCH: "value does not match value_schema",
    NOT_WIRE_FORMAT: "not in the schema registry wire format (magic byte 0, 4-byte schema id)",
    UNKNOWN_SCHEMA: "the schema registry has no schema with this id",
    UNSUPPORTED_SCHEMA: "the writer schema cannot be read in this format",
    DECODE_FAILED: "does not decode with its writer schema",
    SCHEMA_INCOMPATIBLE: "the writer schema cannot be reconciled with the table's columns",
}

# what value_format = "json" can dead-letter (its query observes a count of each)
JSON_CLASSES = (FOREIGN_FILE, NOT_JSON, SCHEMA_MISMATCH)

# the columns a dead-letter row has beyond the landed record's
ERROR_CLASS_COLUMN = "error_class"
ERROR_MESSAGE_COLUMN = "error_message"
SCHEMA_ID_COLUMN = "schema_id"
SOURCE_FILE_COLUMN = "source_file"
DEAD_LETTERED_AT_COLUMN = "dead_lettered_at"

__all__ = [
    "DEAD_LETTERED_AT_COLUMN",
    "DECODE_FAILED",
    "ERROR_CLASSES",
    "ERROR_CLASS_COLUMN",
    "ERROR_MESSAGE_COLUMN",
    "FOREIGN_FILE",
    "JSON_CLASSES",
    "NOT_JSON",
    "NOT_WIRE_FORMAT",
    "SCHEMA_ID_COLUMN",
    "SCHEMA_INCOMPATIBLE",
    "SCHEMA_MISMATCH",
    "SOURCE_FILE_COLUMN",
    "UNKNOWN_SCHEMA",
    "UNSUPPORTED_SCHEMA",
]
