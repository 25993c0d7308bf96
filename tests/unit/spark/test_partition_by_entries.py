"""spark.partition_by entries: columns, named expressions and Iceberg transforms, parsed and checked
without Spark (mqd/spark/partitioning.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.config import ConfigError, load_daemon_config
from mqd.spark.partitioning import PartitionField, parse, problem

COLUMNS = ["topic", "partition", "offset", "timestamp", "dt", "hour", "ts", "country", "id"]


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("topic", PartitionField("topic", "topic")),
        ("`my col`", PartitionField("`my col`", "my col")),
        ("to_date(ts) AS dt", PartitionField("to_date(ts) AS dt", "dt", expression="to_date(ts)")),
        (
            "substr(country, 1, 2) as region",
            PartitionField("substr(country, 1, 2) as region", "region", expression="substr(country, 1, 2)"),
        ),
        (
            "days(timestamp)",
            PartitionField("days(timestamp)", "timestamp_day", transform="day", source="timestamp"),
        ),
        ("HOURS(ts)", PartitionField("HOURS(ts)", "ts_hour", transform="hour", source="ts")),
        (
            "bucket(16, id)",
            PartitionField("bucket(16, id)", "id_bucket", transform="bucket", source="id", argument=16),
        ),
        (
            "truncate(2,country)",
            PartitionField(
                "truncate(2,country)", "country_trunc", transform="trunc", source="country", argument=2
            ),
        ),
        ("identity(topic)", PartitionField("identity(topic)", "topic", transform="identity", source="topic")),
    ],
)
def test_each_kind_of_entry_parses(entry: str, field: PartitionField) -> None:
    """A column, a named expression (any case of AS) and each Iceberg transform parse to what the job
    and the Iceberg sink build from."""
    assert parse(entry) == field


@pytest.mark.parametrize(
    ("entries", "fmt", "words"),
    [
        (["to_date(ts)"], "delta", "named expression"),
        (["bucket(id)"], "iceberg", "positive number"),
        (["days(3, ts)"], "iceberg", "one column"),
        (["days(ts)"], "delta", "Iceberg partition transforms"),
        (["days(nope)"], "iceberg", "unknown columns ['nope']"),
        (["nope"], "delta", "unknown columns ['nope']"),
        (["upper(topic) AS country"], "delta", "existing columns ['country']"),
        (["dt", "to_date(ts) AS dt"], "delta", "more than once"),
    ],
)
def test_what_cannot_partition_the_table_is_named(entries: list[str], fmt: str, words: str) -> None:
    """Each refusal says what is wrong with which entry."""
    assert words in (problem(entries, COLUMNS, fmt) or "")


def test_an_expression_may_give_dt_an_event_time_meaning() -> None:
    """`to_date(ts) AS dt` replaces the landing's dt (the Kafka day), the example users write."""
    assert problem(["topic", "to_date(ts) AS dt"], COLUMNS, "delta") is None
    assert problem(["topic", "days(ts)", "bucket(8, id)"], COLUMNS, "iceberg") is None


@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True))
def test_a_bare_name_is_always_a_column(name: str) -> None:
    """Any identifier is a column entry, never mistaken for an expression or a transform."""
    field = parse(name)
    assert field.is_column and field.name == name and field.table_column == name


def test_config_check_refuses_a_transform_on_a_delta_table(tmp_path: Path) -> None:
    """The check runs at load, naming the key and the file, with the table format in view."""
    path = tmp_path / "mqd.toml"
    path.write_text('[spark]\npartition_by = ["days(timestamp)"]\n')
    with pytest.raises(ConfigError) as err:
        load_daemon_config(path, {})
    assert "spark.partition_by" in str(err.value) and "Iceberg" in str(err.value)
    path.write_text('[spark]\ntable_format = "iceberg"\npartition_by = ["topic", "days(timestamp)"]\n')
    assert load_daemon_config(path, {}).spark.partition_by == ["topic", "days(timestamp)"]
