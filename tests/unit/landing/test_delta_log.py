"""The landing table's pure parts (mqd/landing/delta_log.py): the appId names topic, partition and
incarnation; partition values come from the folders (hour as its number, as Delta writes an int);
an add's statistics are the file's range, timestamps in Delta's ISO form."""

from __future__ import annotations

import json

import pytest

from mqd.landing import delta_log
from mqd.landing.errors import LandingError
from mqd.landing.layout import FileRange

INC = "0123456789abcdef0123456789abcdef"


def rng(incarnation: str | None = INC) -> FileRange:
    return FileRange(
        f"topic=events/dt=2026-12-02/hour=05/part-00003-{INC}-00000000000000000100.parquet",
        "events",
        3,
        100,
        199,
        100,
        1_796_187_600_123,  # 2026-12-02T05:00:00.123Z
        1_796_189_999_999,
        bytes=4096,
        created="2026-12-02T05:41:00.000+00:00",
        incarnation=incarnation,
    )


def test_app_id_names_topic_partition_and_incarnation() -> None:
    """A recreated topic (a new incarnation) is another appId; an unknown incarnation has one too."""
    assert delta_log.app_id("events", 3, INC) == f"mqd-landing/events/3/{INC}"
    assert delta_log.app_id("events", 3, None) == "mqd-landing/events/3/none"
    assert delta_log.app_id("events", 3, INC) != delta_log.app_id("events", 3, "f" * 32)


def test_partition_values_come_from_the_folders() -> None:
    """topic, dt and hour of the path; hour=05 is the int 5 (what the log and Polars' parse agree on)."""
    assert delta_log.partition_values(rng().path) == {"topic": "events", "dt": "2026-12-02", "hour": "5"}
    with pytest.raises(LandingError):
        delta_log.partition_values("_staging/events/00003/x.parquet")


def test_stats_are_the_files_range() -> None:
    """numRecords, offsets, partition, incarnation and timestamps (ms, UTC, Delta's ISO form)."""
    s = json.loads(delta_log.stats(rng()))
    assert s["numRecords"] == 100
    assert s["minValues"] == {
        "partition": 3,
        "offset": 100,
        "timestamp": "2026-12-02T05:00:00.123Z",
        "incarnation": INC,
    }
    assert s["maxValues"] == {
        "partition": 3,
        "offset": 199,
        "timestamp": "2026-12-02T05:39:59.999Z",
        "incarnation": INC,
    }
    assert s["nullCount"] == {"partition": 0, "offset": 0, "timestamp": 0, "incarnation": 0}
    unknown = json.loads(delta_log.stats(rng(None)))
    assert unknown["nullCount"]["incarnation"] == 100 and "incarnation" not in unknown["minValues"]


def test_add_action_carries_path_size_and_creation_time() -> None:
    a = delta_log.add_action(rng())["add"]
    assert (a["path"], a["size"], a["dataChange"]) == (rng().path, 4096, True)
    assert a["modificationTime"] == 1_796_190_060_000  # created, in ms
    assert a["partitionValues"] == delta_log.partition_values(rng().path)


def test_storage_options_for_s3_only() -> None:
    """A local landing needs none; an http endpoint is allowed explicitly (object_store refuses it)."""
    assert delta_log.storage_options("/data/landing", None, None) is None
    opts = delta_log.storage_options("s3://b/p", "http://127.0.0.1:8333", "us-east-1")
    assert opts == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
    }
