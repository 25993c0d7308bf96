"""The one topic-name rule (Kafka's: [A-Za-z0-9._-], 1 to 249 characters, not "." or "..") and the
edges that use it: the config, the landing's path builders and the CLI's partition specs."""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.landing import read_manifest, read_watermarks, update_markers

from mqd.errors import MqdError
from mqd.landing import layout
from mqd.landing.local_store import LocalStore
from mqd.operator.admin import AdminError, parse_partition_spec
from mqd.operator.produce_command import produce_cli
from mqd.topic_name import MAX_LENGTH, InvalidTopicName, check_topic_name, topic_name_problem

VALID = ["events", "a", "A.b-c_9", "..a", "a..", "-", "_", "x" * MAX_LENGTH]
INVALID = [
    "",
    ".",
    "..",
    "../../etc",
    "a/b",
    "/",
    "a b",
    "a\n",
    "é",
    "a:b",
    "*",
    "x" * (MAX_LENGTH + 1),
    "a\0",
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names_pass_unchanged(name: str) -> None:
    """Names inside the rule pass and come back as they are (so the check composes into paths)."""
    assert topic_name_problem(name) is None
    assert check_topic_name(name) == name


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names_are_refused_with_a_reason(name: str) -> None:
    """Empty, '.', '..', path separators, other characters and over-long names are refused."""
    problem = topic_name_problem(name)
    assert problem
    with pytest.raises(InvalidTopicName) as info:
        check_topic_name(name)
    assert str(info.value) == problem
    assert isinstance(info.value, MqdError) and isinstance(info.value, ValueError)
    assert info.value.retriable is False


def test_non_strings_are_refused() -> None:
    """A JSON body may carry any type where a topic is expected."""
    for value in (None, 1, ["events"], b"events"):
        assert topic_name_problem(value)


@given(st.text(max_size=300))
def test_rule_matches_kafka(name: str) -> None:
    """For any text, valid exactly when Kafka's rule says so."""
    kafka = (
        1 <= len(name) <= 249
        and name not in (".", "..")
        and all(c in string.ascii_letters + string.digits + "._-" for c in name)
    )
    assert (topic_name_problem(name) is None) == kafka


@pytest.mark.parametrize("name", ["..", "../../etc", ".", "a/b", ""])
def test_landing_never_builds_a_path_from_an_invalid_name(tmp_path: Path, name: str) -> None:
    """Every landing path builder refuses the name before any path exists; nothing is created."""
    store = LocalStore(tmp_path / "landing")
    calls: list[Callable[[], object]] = [
        lambda: layout.topic_dir(name),
        lambda: layout.hour_dir(name, 0),
        lambda: layout.topic_state_dir(name),
        lambda: layout.topic_manifest_dir(name),
        lambda: store.head(name, 0),
        lambda: store.advance_watermark(name, 0, 1),
        lambda: read_watermarks(tmp_path / "landing", name, 1),
        lambda: update_markers(tmp_path / "landing", name, 1),
        lambda: read_manifest(tmp_path / "landing", name),
    ]
    for call in calls:
        with pytest.raises(InvalidTopicName):
            call()
    assert not (tmp_path / "etc").exists()
    assert not any(p.name == "etc" for p in tmp_path.rglob("*"))


def test_cli_partition_specs_use_the_same_rule() -> None:
    """`mqd pause ..:0` is refused like any other edge would refuse '..'."""
    assert parse_partition_spec("events:3") == ("events", 3)
    for bad in ("..", "..:0", ".:1", "a/b:0"):
        with pytest.raises(AdminError):
            parse_partition_spec(bad)


def test_mqd_produce_refuses_an_invalid_topic_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    """`mqd produce --topic ../../etc` is a usage error (exit 2); the unreachable bootstrap is never tried."""
    code = produce_cli("http://127.0.0.1:1", "../../etc", 1, 10, 0, 0, 1, "master", None)
    assert code == 2
    assert "--topic: topic '../../etc' may only use" in capsys.readouterr().err
