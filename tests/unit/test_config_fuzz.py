"""Fuzzing the config loaders key by key: a TOML document that sets the real keys of the daemon's
or a broker node's config to hostile values (inf, NaN, 10**400, empty, NUL, newlines, ``..``, wrong
types, nested tables) either loads into a config `mqd run` and the broker can use, or raises
ConfigError whose message names the file and the key (``consumer.session_timeout``), never another
exception and never a message that leaves the operator guessing which line to fix.

tests/unit/test_fuzz_config.py fuzzes whole documents, bytes and the environment for "a ConfigError
or a config"; this file pins what the message says.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from support import REPO_ROOT

from mqd.config import (
    BrokerConfig,
    ConfigError,
    MqdConfig,
    check_file,
    load_broker_config,
    load_daemon_config,
)
from mqd.topic_name import topic_name_problem

_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of every scalar-or-list key of ``model``, sub-models walked."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_leaf_keys(ann, f"{prefix}{name}."))
        else:
            out.append(prefix + name)
    return out


DAEMON_KEYS = _leaf_keys(MqdConfig)
# the three keys a node file must have stay valid unless drawn; the rest start at their defaults
BROKER_KEYS = _leaf_keys(BrokerConfig)
BROKER_BASE = {"node_id": "single", "cluster_file": "cluster-single.toml", "data_dir": "data"}

# any text TOML can hold (a lone surrogate cannot be written in a TOML string)
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=10)
hostile = st.one_of(
    st.sampled_from(
        [
            math.inf,
            -math.inf,
            math.nan,
            10**400,
            -(10**400),
            2**63,
            -(2**63),
            -1,
            0,
            1e309,
            "",
            " ",
            "\0",
            "a\0b",
            "a\nb",
            "\x1b[31m",
            ".",
            "..",
            "../../etc",
            "/",
            "x" * 5000,
            "ftp://127.0.0.1:9400",
            "http://",
            "inf",
            "nan",
            "-1",
            True,
            [],
            [".."],
            ["ftp://x"],
            [1, "a"],
            {},
            {"a": 1},
        ]
    ),
    st.integers(),
    st.floats(),
    text,
    st.lists(text, max_size=3),
)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        # JSON's escapes are TOML's, but a character outside the BMP must stay whole and DEL escaped
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + "}"


def _document(values: dict[str, Any]) -> str:
    """Dotted keys as TOML: top-level keys first, then one table per section."""
    top = {k: v for k, v in values.items() if "." not in k}
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    sections: dict[str, list[str]] = {}
    for key, v in values.items():
        if "." in key:
            section, _, name = key.rpartition(".")
            sections.setdefault(section, []).append(f"{name} = {_toml(v)}")
    for section, body in sections.items():
        lines += [f"[{section}]", *body]
    return "\n".join(lines) + "\n"


def _assert_usable(value: Any, where: str = "") -> None:
    """What loaded is usable: finite floats, 64-bit integers, no NUL in text, topic names in the rule."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _assert_usable(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _assert_usable(v, f"{where}[{i}]")
    elif isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, int) and not isinstance(value, bool):
        assert -(2**63) <= value < 2**63, where
    elif isinstance(value, str | Path):
        assert "\0" not in str(value), where
    if where == ".consumer.topics":
        for topic in value:
            assert topic_name_problem(topic) is None, where


def _assert_names_file_and_keys(exc: ConfigError, path: Path, keys: list[str]) -> None:
    """The message names the file, and every problem it lists names one of the keys set."""
    text = str(exc)
    assert str(path) in text, text
    first, _, rest = text.partition("\n")
    # a validation error lists one problem a line; any other error is one sentence (whose quoted
    # value may hold a newline) naming the key
    problems = [line.strip() for line in rest.splitlines() if line.strip()]
    if not first.endswith("invalid configuration"):
        assert any(k in first for k in keys), text
        return
    for line in problems:
        named = line.partition(":")[0]
        exact = any(re.fullmatch(re.escape(k) + r"(\.\d+)*(\..*)?", named) for k in keys)
        # a rule across keys names their section and the keys in its text
        across = any(k.startswith(named + ".") and k.rpartition(".")[2] in line for k in keys)
        assert exact or across, (line, keys)


@_SETTINGS
@given(values=st.dictionaries(st.sampled_from(DAEMON_KEYS), hostile, min_size=1, max_size=4))
@example(values={"consumer.session_timeout": math.inf})
@example(values={"landing.dir": ""})
@example(values={"consumer.topics": ["..", "../../etc"]})
@example(values={"consumer.auth_token": "a\nb"})
@example(values={"consumer.bootstrap": ["ftp://x"]})
def test_daemon_keys_with_hostile_values_load_or_name_key_and_file(
    tmp_path_factory: Any, values: dict[str, Any]
) -> None:
    """The daemon's keys set to hostile values: `mqd config check` and `mqd run`'s loader agree,
    and either give a usable config or a ConfigError naming the file and the key."""
    path = tmp_path_factory.mktemp("cfg") / "mqd.toml"
    path.write_text(_document(values))
    outcomes = []
    for load in (lambda: load_daemon_config(path, {}), lambda: check_file(path, {})):
        try:
            cfg = load()
        except ConfigError as exc:
            _assert_names_file_and_keys(exc, path, list(values))
            outcomes.append(False)
        else:
            _assert_usable(cfg)
            outcomes.append(True)
    assert outcomes[0] == outcomes[1], "`mqd config check` and `mqd run` disagree"


@_SETTINGS
@given(values=st.dictionaries(st.sampled_from(BROKER_KEYS), hostile, min_size=1, max_size=4))
@example(values={"limits.body_timeout_ms": math.inf})
@example(values={"limits.header_timeout_ms": 0})
@example(values={"auth_token": "a\0b"})
@example(values={"data_dir": ""})
def test_broker_keys_with_hostile_values_load_or_name_key_and_file(
    tmp_path_factory: Any, values: dict[str, Any]
) -> None:
    """A broker node's keys set to hostile values (the rest of a valid single-node file kept): a
    usable config or a ConfigError naming the file and the key."""
    d = tmp_path_factory.mktemp("cfg")
    (d / "cluster-single.toml").write_text((REPO_ROOT / "config" / "cluster-single.toml").read_text())
    path = d / "broker.toml"
    path.write_text(_document({**BROKER_BASE, **values}))
    try:
        cfg = load_broker_config(path)
    except ConfigError as exc:
        _assert_names_file_and_keys(exc, path, list(values))
    else:
        _assert_usable(cfg)
