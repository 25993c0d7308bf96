"""What Spark would refuse, refused by ``mqd config check`` without Spark (mqd/spark/static_checks.py,
the spark section of mqd/config.py), and the reachability check that keeps an unreachable master
from costing a minute of JVM retries (mqd/spark/session.py)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from mqd.config import ConfigError, MqdConfig, SparkConfig, load_daemon_config
from mqd.spark.job import query_name
from mqd.spark.session import SessionError, check_reachable
from mqd.spark.static_checks import (
    ddl_field_names,
    master_problem,
    partition_problem,
    spark_masters,
    trigger_interval,
)


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[*]",
        "local[2]",
        "local[4,3]",
        "local[*,2]",
        "local-cluster[2, 1, 1024]",
        "spark://10.0.0.1:7077",
        "spark://a.example:7077,b.example:7077",
        "spark://[::1]:7077",
        "yarn",
        "k8s://https://10.0.0.1:6443",
    ],
)
def test_masters_spark_knows_are_accepted(master: str) -> None:
    """Every master form Spark 4 creates a scheduler for passes, in the config too."""
    assert master_problem(master) is None
    assert SparkConfig(master=master).master == master


@pytest.mark.parametrize(
    "master",
    [
        "yarn-cluster-nope",
        "mesos://h:5050",
        "spark://host",
        "spark://h:0",
        "spark://h:7077,",
        "local[0]",
        "k8s://",
        "",
    ],
)
def test_masters_spark_refuses_are_refused(master: str) -> None:
    """A master Spark cannot parse (or Spark 4 dropped: Mesos) is named with the forms it takes."""
    problem = master_problem(master)
    assert problem is not None and repr(master) in problem


@pytest.mark.parametrize(
    ("text", "spark"),
    [
        ("10 seconds", "10 seconds"),
        ("1 minute 30 seconds", "1 minute 30 seconds"),
        ("interval 2 hours", "interval 2 hours"),
        ("0 seconds", "0 seconds"),
        ("1.5 seconds", "1.5 seconds"),
        ("500ms", "500 milliseconds"),
        ("5s", "5 seconds"),
        ("2m", "120 seconds"),
        ("1h", "3600 seconds"),
        ("1.5s", "1500 milliseconds"),
        ("1m30s", "90 seconds"),
    ],
)
def test_trigger_intervals_read_as_spark_reads_them(text: str, spark: str) -> None:
    """Spark's interval strings pass as they are; mqd's short durations become Spark's form."""
    assert trigger_interval(text) == spark
    assert SparkConfig(trigger_interval=text).trigger_interval == spark


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ten seconds", "not an interval"),
        ("10", "not an interval"),
        ("", "not an interval"),
        ("1 month", "months or years"),
        ("2 years", "months or years"),
        ("5 parsecs", "unknown unit"),
        ("1.5 hours", "only seconds"),
        ("-5 seconds", "not an interval"),
    ],
)
def test_bad_trigger_intervals_are_refused(text: str, needle: str) -> None:
    """What Spark's processing-time trigger refuses is refused with the reason."""
    with pytest.raises(ValueError, match=needle):
        trigger_interval(text)


def test_ddl_field_names_are_the_top_level_ones() -> None:
    """Nested struct fields and type parameters are not taken for columns; backquotes come off."""
    assert ddl_field_names("a INT, `b c` STRUCT<x: INT, y: DECIMAL(10, 2)>, d MAP<STRING, INT>") == [
        "a",
        "b c",
        "d",
    ]


def test_partition_columns_must_be_table_columns() -> None:
    """Unknown, repeated or all columns as partition columns are refused (Spark refuses all three)."""
    assert partition_problem(["topic", "dt"], ["topic", "dt", "value"]) is None
    assert "unknown columns ['nope']" in (partition_problem(["nope"], ["topic"]) or "")
    assert "more than once" in (partition_problem(["dt", "dt"], ["dt", "topic"]) or "")
    assert "every column" in (partition_problem(["dt", "topic"], ["dt", "topic"]) or "")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mqd.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('master = "yarn-cluster-nope"', "spark.master"),
        ('master = "spark://127.0.0.1"', "spark.master"),
        ('trigger_interval = "ten seconds"', "spark.trigger_interval"),
        ('partition_by = ["topic", "day"]', "spark.partition_by"),
        ('value_format = "json"\nvalue_schema = "a INT"\npartition_by = ["value"]', "spark.partition_by"),
        ('log_level = "LOUD"', "spark.log_level"),
    ],
)
def test_config_check_refuses_what_spark_would(tmp_path: Path, body: str, key: str) -> None:
    """Each value that failed only when the job started now fails loading, naming key and file."""
    path = _write(tmp_path, f"[spark]\n{body}\n")
    with pytest.raises(ConfigError) as err:
        load_daemon_config(path, {})
    assert key in str(err.value) and str(path) in str(err.value)


def test_json_tables_partition_by_value_fields(tmp_path: Path) -> None:
    """With value_format = "json" the parsed fields are columns: partitioning by one is fine."""
    body = (
        '[spark]\nvalue_format = "json"\nvalue_schema = "country STRING, n INT"\npartition_by = ["country"]\n'
    )
    assert load_daemon_config(_write(tmp_path, body), {}).spark.partition_by == ["country"]


def test_query_name_is_the_table_name(tmp_path: Path) -> None:
    """One name per query, from the output directory, stable across runs."""
    cfg = MqdConfig(spark=SparkConfig(output_dir=tmp_path / "events"))
    assert query_name(cfg) == "mqd-events"
    assert query_name(cfg, quarantine=True) == "mqd-events-quarantine"


def test_spark_masters_lists_standalone_nodes() -> None:
    """The nodes of a standalone master URL, standby masters included; none for other masters."""
    assert spark_masters("spark://a:7077,[::1]:7078") == [("a", 7077), ("::1", 7078)]
    assert spark_masters("local[2]") == [] and spark_masters("yarn") == []


def test_unreachable_master_fails_the_check_at_once() -> None:
    """A closed port on every master is a SessionError naming them, in well under Spark's 60 s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        t0 = time.monotonic()
        with pytest.raises(SessionError, match=f"127.0.0.1:{port}"):
            check_reachable(f"spark://127.0.0.1:{port}", timeout=5.0)
        assert time.monotonic() - t0 < 5.0


def test_one_reachable_master_is_enough() -> None:
    """With standby masters, one that accepts a connection passes; non-standalone masters pass."""
    with socket.socket() as dead, socket.socket() as live:
        dead.bind(("127.0.0.1", 0))
        live.bind(("127.0.0.1", 0))
        live.listen()
        check_reachable(f"spark://127.0.0.1:{dead.getsockname()[1]},127.0.0.1:{live.getsockname()[1]}")
    check_reachable("local[2]")
    check_reachable("yarn")
