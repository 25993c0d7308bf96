"""The landing schema is defined once: the Spark DDL the job reads with is derived from the Arrow
schema a landed file is written with, and this test ties the two (and the record schema)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from mqd.landing import delta_log, layout, schema
from mqd.records import RECORD_SCHEMA
from mqd.spark import job

# The Spark side as it must stay for the checkpoints and tables users already have: a change of
# the Arrow schema that changes this is a change of the landing format, not a refactoring.
# Landing format 2 added ``incarnation`` (the log incarnation; null in format-1 files).
EXPECTED_DDL = (
    "topic STRING, partition INT, incarnation STRING, offset BIGINT, timestamp TIMESTAMP, "
    "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, dt STRING, hour INT"
)


def test_spark_ddl_is_derived_from_the_arrow_schema() -> None:
    """The job's DDL and columns are the schema module's, generated from LANDING_SCHEMA, and equal
    the pinned DDL: changing one side without the other fails here."""
    assert schema.landing_ddl() == EXPECTED_DDL
    assert job.LANDING_DDL == EXPECTED_DDL
    assert job._LANDING_COLUMNS == [*schema.LANDING_SCHEMA.names, "dt", "hour"]


def test_landing_schema_is_the_record_schema_plus_topic_partition_and_incarnation() -> None:
    """A landed file's columns are topic, partition, incarnation and then exactly the decoded
    record columns."""
    assert schema.LANDING_SCHEMA.names[:3] == ["topic", "partition", "incarnation"]
    assert pa.schema(list(schema.LANDING_SCHEMA)[3:]) == RECORD_SCHEMA
    assert layout.LANDING_SCHEMA is schema.LANDING_SCHEMA


def test_a_landed_table_has_the_landing_schema() -> None:
    """What the publisher encodes (layout.landing_table) carries exactly LANDING_SCHEMA, so the
    DDL derived from it describes the files on disk."""
    records = pa.table(
        {
            "offset": pa.array([0, 1], pa.int64()),
            "timestamp": pa.array(np.array([0, 1], dtype="datetime64[ms]"), pa.timestamp("ms", tz="UTC")),
            "key": pa.array([b"k", None], pa.binary()),
            "value": pa.array([b"v", b"w"], pa.binary()),
            "headers": pa.array([[], [{"key": "h", "value": b"x"}]], RECORD_SCHEMA.field("headers").type),
        },
        schema=RECORD_SCHEMA,
    )
    assert layout.landing_table("t", 3, records).schema == schema.LANDING_SCHEMA
    inc = "0123456789abcdef0123456789abcdef"
    landed = layout.landing_table("t", 3, records, inc)
    assert landed.schema == schema.LANDING_SCHEMA
    assert landed.column("incarnation").to_pylist() == [inc, inc]
    assert layout.landing_table("t", 3, records).column("incarnation").to_pylist() == [None, None]


def test_an_unmapped_arrow_type_is_refused() -> None:
    """A new column of a type with no Spark mapping fails loudly instead of being guessed."""
    with pytest.raises(ValueError, match="no Spark type"):
        schema.spark_type(pa.float16())
    assert schema.spark_type(pa.dictionary(pa.int32(), pa.string())) == "STRING"


def test_delta_types_of_the_landing_table_columns_and_no_guess_for_others() -> None:
    """Each landing column has its Delta type (dictionaries as their values, the headers an array of
    structs); a zoneless timestamp (Delta's timestamp_ntz, a writer-7 feature) or any type the
    landing does not use is refused, not mapped to something near it."""
    delta_schema = schema.spark_json_struct(delta_log.table_schema())
    types = {f["name"]: f["type"] for f in delta_schema["fields"]}
    assert types["topic"] == "string" and types["partition"] == "integer" and types["offset"] == "long"
    assert types["timestamp"] == "timestamp" and types["hour"] == "integer"
    assert types["headers"]["type"] == "array"
    assert [f["name"] for f in types["headers"]["elementType"]["fields"]] == ["key", "value"]
    for t in (pa.timestamp("ms"), pa.float64(), pa.large_string()):
        with pytest.raises(ValueError, match="no Delta type"):
            schema.spark_json_type(t)
