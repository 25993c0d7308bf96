"""The one duration and size syntax (mqd/units.py) and its use by every config key (issue 17)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqd.config import ConfigError, load_broker_config, load_daemon_config
from mqd.units import (
    format_duration_ms,
    format_size,
    jvm_memory,
    parse_duration,
    parse_duration_ms,
    parse_size,
    spark_interval,
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("5s", 5000),
        ("1.5s", 1500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("7d", 604_800_000),
        ("1m30s", 90_000),
        ("1h 30m", 5_400_000),
        ("0s", 0),
        ("1.1s", 1100),
        (" 5s ", 5000),
    ],
)
def test_durations_read_exactly(text: str, ms: int) -> None:
    """Each documented form reads as the milliseconds it says, exactly (no float rounding)."""
    assert parse_duration_ms(text) == ms
    assert parse_duration(text) == ms / 1000


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("32MiB", 32 * 1024**2),
        ("512KiB", 512 * 1024),
        ("1GiB", 1024**3),
        ("64MB", 64_000_000),
        ("1kb", 1000),
        ("100B", 100),
        ("1.5KiB", 1536),
        ("2TiB", 2 * 1024**4),
        ("8 MiB", 8 * 1024**2),
    ],
)
def test_sizes_read_exactly(text: str, size: int) -> None:
    """1024-based units for KiB/MiB/GiB, 1000-based for KB/MB/GB (MB is 10^6 bytes)."""
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text",
    [
        "",
        "5",
        "1.5",
        "ten",
        "5 seconds",
        "-5s",
        "5x",
        "inf",
        "nans",
        "1e3s",
        "5sec",
        "s",
        "1.s",
        "9" * 500 + "h",
    ],
)
def test_junk_durations_are_refused(text: str) -> None:
    """Anything but number+unit runs is refused with the accepted forms (or the reason)."""
    with pytest.raises(ValueError, match=r"duration|unit|range"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", "32", "32M", "32 mebibytes", "-1MiB", "1.5B", "0.3KiB", "MiB", "inf"])
def test_junk_sizes_are_refused(text: str) -> None:
    """Unknown units, bare numbers as text, negatives and fractions of a byte are refused."""
    with pytest.raises(ValueError, match=r"size|unit|whole"):
        parse_size(text)


@given(st.integers(min_value=0, max_value=10**15))
def test_durations_round_trip(ms: int) -> None:
    """Any whole number of milliseconds formats to text that reads back to itself."""
    assert parse_duration_ms(format_duration_ms(ms)) == ms


@given(st.integers(min_value=0, max_value=10**18))
def test_sizes_round_trip(size: int) -> None:
    """Any byte count formats to text that reads back to itself."""
    assert parse_size(format_size(size)) == size


@given(st.text(max_size=20))
def test_arbitrary_text_never_crashes(text: str) -> None:
    """Any text is either a valid value or a ValueError: never another exception, never inf/NaN."""
    for parse in (parse_duration, parse_duration_ms, parse_size):
        try:
            value = parse(text)
        except ValueError:
            continue
        assert math.isfinite(value) and value >= 0


def test_spark_and_jvm_forms() -> None:
    """trigger_interval and driver_memory take the syntax and hand Spark its own form."""
    assert spark_interval("1.5s") == "1500 milliseconds"
    assert spark_interval("2m") == "120 seconds"
    assert spark_interval("10 seconds") is None  # Spark's own form, checked by static_checks
    assert jvm_memory("2GiB") == "2g" and jvm_memory("512m") == "512m" and jvm_memory("1536MiB") == "1536m"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mqd.toml"
    path.write_text(text)
    return path


def test_every_daemon_key_takes_units(tmp_path: Path) -> None:
    """Durations and sizes with units land as the key's own unit; bare numbers keep their unit."""
    cfg = load_daemon_config(
        _write(
            tmp_path,
            """
[consumer]
consume_from = "earliest"
session_timeout = "5s"
rebalance_interval = 7
fetch_max_wait_ms = "1.5s"
error_backoff_ms = 200
max_buffered_bytes = "64MiB"
fetch_max_bytes = 1048576
[landing]
max_bytes = "32MiB"
max_age = "500ms"
[spark]
trigger_interval = "1m"
driver_memory = "2GiB"
[daemon]
shutdown_timeout = "1m"
""",
        ),
        environ={},
    )
    c = cfg.consumer
    assert (c.consume_from, c.session_timeout, c.rebalance_interval) == ("first", 5.0, 7.0)
    assert (c.fetch_max_wait_ms, c.error_backoff_ms) == (1500, 200)
    assert (c.max_buffered_bytes, c.fetch_max_bytes) == (64 * 1024**2, 1048576)
    assert (cfg.landing.max_bytes, cfg.landing.max_age) == (32 * 1024**2, 0.5)
    assert (cfg.spark.trigger_interval, cfg.spark.driver_memory) == ("60 seconds", "2g")
    assert cfg.daemon.shutdown_timeout == 60.0


def test_environment_overrides_take_units(tmp_path: Path) -> None:
    """MQD_* overrides take the same syntax (a number key given "5s" is read as a duration)."""
    cfg = load_daemon_config(
        _write(tmp_path, ""), environ={"MQD_LANDING__MAX_AGE": "2s", "MQD_CONSUMER__FETCH_MAX_BYTES": "1MiB"}
    )
    assert (cfg.landing.max_age, cfg.consumer.fetch_max_bytes) == (2.0, 1024**2)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('[landing]\nmax_age = "5 seconds"', "landing.max_age: not a duration; use '500ms'"),
        ('[landing]\nmax_bytes = "32M"', "landing.max_bytes: not a size; use '512KiB'"),
        ('[consumer]\nfetch_max_wait_ms = "0.5ms"', "consumer.fetch_max_wait_ms: not a whole number of ms"),
        ('[consumer]\nsession_timeout = "5"', "consumer.session_timeout: no unit"),
        ("[consumer]\nsession_timeout = inf", "consumer.session_timeout"),
        ("[consumer]\nsession_timeout = nan", "consumer.session_timeout"),
        (
            '[consumer]\nsession_timeout = "2h"',
            "consumer.session_timeout: Input should be less than or equal",
        ),
        ("[consumer]\nheartbeat_interval = -1", "consumer.heartbeat_interval"),
        ('[consumer]\nconsume_from = "frist"', "did you mean 'first'?"),
        ('[consumer]\non_offset_reset = "earlist"', "did you mean 'earliest'?"),
        ('[spark]\ntrigger_interval = "ten seconds"', "spark.trigger_interval"),
    ],
)
def test_bad_values_name_key_file_and_forms(tmp_path: Path, line: str, needle: str) -> None:
    """A bad duration or size is refused naming the file, the key and the accepted forms."""
    path = _write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as err:
        load_daemon_config(path, environ={})
    text = str(err.value).replace("milliseconds", "ms")
    assert str(path) in text and needle in text, text


def test_broker_keys_take_units(tmp_path: Path) -> None:
    """Broker node files take the syntax too; a *_ms key's bare number stays milliseconds."""
    (tmp_path / "cluster.toml").write_text(
        '[[groups]]\nname = "a"\nnodes = [{id = "n1", url = "http://127.0.0.1:9400", role = "master"}]\n'
    )
    path = tmp_path / "node.toml"
    path.write_text(
        'node_id = "n1"\ncluster_file = "cluster.toml"\ndata_dir = "d"\nsession_timeout_ms = 2000\n'
        'acks_all_timeout_ms = "10s"\n[storage]\nsegment_bytes = "64MiB"\nretention_ms = "7d"\n'
        'retention_bytes = -1\n[limits]\nmax_request_bytes = "1GB"\n'
    )
    cfg, _ = load_broker_config(path)
    assert (cfg.session_timeout_ms, cfg.acks_all_timeout_ms) == (2000, 10_000)
    assert (cfg.storage.segment_bytes, cfg.storage.retention_ms, cfg.storage.retention_bytes) == (
        64 * 1024**2,
        7 * 86_400_000,
        -1,
    )
    assert cfg.limits.max_request_bytes == 10**9
