"""Fuzzing the config loaders: any file (random TOML documents, mutated shipped files, random bytes)
and any MQD_* environment either loads into a valid config or raises ConfigError with a message,
never another exception."""

from __future__ import annotations

import json
import math
import os
import re
import string
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from support import REPO_ROOT

from mqd.config import (
    NOT_OVERRIDES,
    BrokerConfig,
    ClusterConfig,
    ConfigError,
    MqdConfig,
    check_file,
    load_broker_config,
    load_cluster_config,
    load_daemon_config,
)
from mqd.topic_name import topic_name_problem

ROOT = REPO_ROOT
SHIPPED = sorted((ROOT / "config").glob("*.toml"))
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- a TOML writer for arbitrary documents (inline tables nest to any depth) ----------------------


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON escapes are TOML basic-string escapes (\\uXXXX included)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_document(data: dict[str, Any]) -> str:
    """Top-level scalars first, then one ``[table]`` per dict value (so sections look real)."""
    lines = [f"{json.dumps(k)} = {_toml(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{json.dumps(k)}]")
            lines.extend(f"{json.dumps(kk)} = {_toml(vv)}" for kk, vv in v.items())
    return "\n".join(lines) + "\n"


def _keys(model: type[Any]) -> list[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(name)
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out.update(ann.model_fields)
    return sorted(out)


KEYS = sorted(set(_keys(MqdConfig) + _keys(BrokerConfig) + _keys(ClusterConfig)) | {"nodes", "partitions"})
SECTIONS = [*sorted(MqdConfig.model_fields), "storage", "limits", "groups", "topics"]

nasty_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "/",
            "\0",
            "a\0b",
            "x" * 5000,
            "/" + "d/" * 3000,
            "http://",
            "~",
            "local[*]",
            "-1",
            "1e309",
            "snappy",
            "json",
            "cluster",
            "master",
            "events",
            "inf",
            "nan",
            "../../etc",
            "a\nb",
            "tok en",
            "ftp://127.0.0.1:9400",
            "127.0.0.1:9400",
            "http://:9400",
            "http://h:99999",
            "http://127.0.0.1:9400",
            "x" * 250,
        ]
    ),
)
scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**63, 10**400, -(10**400)]),
    st.floats(min_value=1e300),
    st.floats(),
    nasty_text,
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=10,
)
documents = st.dictionaries(
    st.sampled_from(KEYS + SECTIONS) | st.text(max_size=8),
    st.one_of(values, st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=6)),
    max_size=8,
)


def _assert_usable(value: Any, where: str = "") -> None:
    """What loaded is usable by `mqd run` and the broker: finite floats, 64-bit integers, topic
    names inside the rule."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _assert_usable(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _assert_usable(v, f"{where}[{i}]")
    elif isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, int) and not isinstance(value, bool):
        assert -(2**63) < value < 2**63, where
    if where == ".consumer.topics" or re.fullmatch(r"\.topics\[\d+\]\.name", where):
        for t in value if isinstance(value, list) else [value]:
            assert topic_name_problem(t) is None, where


def _load_all(path: Path, environ: dict[str, str] | None = None) -> None:
    """Every loader on ``path``: a model or ConfigError, nothing else; a model is usable."""
    env = environ or {}
    for load in (
        lambda: check_file(path, env),
        lambda: load_daemon_config(path, env),
        lambda: load_broker_config(path),
        lambda: load_cluster_config(path),
    ):
        try:
            result = load()
        except ConfigError as exc:
            assert str(exc), "a ConfigError must say what is wrong"
            assert exc.retriable is False
        else:
            assert result is not None
            for part in result if isinstance(result, tuple) else (result,):
                _assert_usable(part)


@_SETTINGS
@given(doc=documents)
@example(doc={"cluster_file": "a\0b", "node_id": "n", "data_dir": "d"})
@example(doc={"cluster_file": "x" * 5000, "node_id": "n", "data_dir": "d"})
@example(doc={"landing": {"dir": "a\0b"}})
@example(doc={"consumer": {"session_timeout": math.inf}})
@example(doc={"landing": {"max_age": math.inf}})  # loaded before, an OverflowError later
@example(doc={"consumer": {"flow_control_retry_ms": 10**400}})
@example(doc={"landing": {"dir": ""}})
@example(doc={"consumer": {"topics": ["..", "../../etc"], "bootstrap": ["ftp://x"], "auth_token": "a\nb"}})
@example(doc={"groups": [{"name": "g", "nodes": [{"id": "n", "url": "http://:1", "role": "master"}]}]})
def test_random_toml_documents_load_or_raise_config_error(tmp_path_factory: Any, doc: dict[str, Any]) -> None:
    """Random documents over the real key names, with wrong types, huge numbers, inf/nan, NUL bytes
    and over-long paths: a valid config or a ConfigError."""
    path = tmp_path_factory.mktemp("cfg") / "fuzz.toml"
    path.write_text(to_document(doc))
    _load_all(path)


@_SETTINGS
@given(data=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
def test_random_bytes_as_a_config_file(tmp_path_factory: Any, data: bytes) -> None:
    """Not TOML, not UTF-8, empty: a ConfigError naming the file (or a default config)."""
    path = tmp_path_factory.mktemp("cfg") / "fuzz.toml"
    path.write_bytes(data)
    _load_all(path)


@_SETTINGS
@given(
    source=st.sampled_from(SHIPPED),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["uncomment", "delete", "replace", "insert"]),
            st.integers(0, 10**6),
            st.sampled_from([*string.printable, "\0", "é", "\x7f"]),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_mutated_shipped_files(
    tmp_path_factory: Any, source: Path, edits: list[tuple[str, int, str]]
) -> None:
    """The shipped files with lines uncommented and characters deleted, replaced or inserted
    (relative paths still point at the real neighbour files)."""
    lines = source.read_text().splitlines()
    for op, at, ch in edits:
        i = at % max(len(lines), 1)
        if not lines:
            break
        line = lines[i]
        if op == "uncomment":
            lines[i] = line.lstrip("# ")
        elif op == "delete" and line:
            j = at % len(line)
            lines[i] = line[:j] + line[j + 1 :]
        elif op == "replace" and line:
            j = at % len(line)
            lines[i] = line[:j] + ch + line[j + 1 :]
        else:
            j = at % (len(line) + 1)
            lines[i] = line[:j] + ch + line[j:]
    path = tmp_path_factory.mktemp("cfg") / source.name
    for sibling in SHIPPED:  # a broker file names its cluster file relative to itself
        if sibling != source:
            (path.parent / sibling.name).write_text(sibling.read_text())
    path.write_text("\n".join(lines) + "\n")
    _load_all(path)


env_names = (
    st.builds(
        lambda s, k: f"MQD_{s}__{k}".upper(),
        st.sampled_from(SECTIONS) | st.text(alphabet=string.ascii_letters + "_", max_size=6),
        st.sampled_from(KEYS) | st.text(alphabet=string.ascii_letters + "_", max_size=6),
    )
    | st.builds(  # one underscore, a stray name, or a variable that is not an override
        lambda s, sep, k: f"MQD_{s}{sep}{k}".upper(),
        st.sampled_from(SECTIONS) | st.text(alphabet=string.ascii_letters + "_", max_size=6),
        st.sampled_from(["_", "", "___"]),
        st.sampled_from(KEYS) | st.text(alphabet=string.ascii_letters + "_", max_size=6),
    )
    | st.sampled_from(["MQD_TOKEN", "MQD_CONFIG", "MQD_BIN", "MQD_", "MQD_CONSUMER_GROUP"])
)


@_SETTINGS
@given(
    environ=st.dictionaries(
        env_names,
        nasty_text
        | st.sampled_from(['["a", 1]', "[", "{", "1_000", "nan", "inf", "1e400", str(10**400), '[".."]']),
        max_size=5,
    )
)
@example(environ={"MQD_LANDING__DIR": ""})
@example(environ={"MQD_CONSUMER_GROUP": "x"})
@example(environ={"MQD_CONSUMER__SESSION_TIMEOUT": "inf"})
def test_random_environment_overrides(tmp_path_factory: Any, environ: dict[str, str]) -> None:
    """MQD_ variables with any name and value: a usable config or a ConfigError; an unknown
    MQD_ variable (one that is not a known non-override) is always an error naming it."""
    path = tmp_path_factory.mktemp("cfg") / "mqd.toml"
    path.write_text((ROOT / "config" / "mqd.toml").read_text())
    stray = [n for n in environ if "__" not in n and n not in NOT_OVERRIDES]
    try:
        cfg = load_daemon_config(path, environ)
    except ConfigError as exc:
        assert str(exc)
        for name in stray:
            assert name in str(exc)
    else:
        assert not stray, stray
        _assert_usable(cfg)


def test_unreadable_paths_are_config_errors(tmp_path: Path) -> None:
    """A config path that is a directory, over-long, or holds a NUL byte is a ConfigError."""
    for bad in (tmp_path, tmp_path / ("x" * 5000), Path(str(tmp_path) + "/a\0b"), Path(os.devnull + "/x")):
        try:
            check_file(bad, {})
        except ConfigError as exc:
            assert str(bad)[:20] in str(exc) or "config" in str(exc)
