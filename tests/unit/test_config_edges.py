"""One validation at every edge: each value `mqd run` or the broker would refuse is refused by the
config loader (so `mqd config check` exits 2) with the key and the file. Each case here was
accepted before (issue 13, point 5)."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from support.config import config_error as _error
from support.config import write_file as _write

from mqd.config import (
    BrokerConfig,
    ClusterConfig,
    ConfigError,
    MqdConfig,
    load_broker_config,
    load_cluster_config,
    load_daemon_config,
)
from mqd.operator.cli import main

EXIT_CONFIG = 2


def _check_exit(path: Path, environ: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["config", "check", str(path)], env=environ or {})
    return result.exit_code, result.output


# -- numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "+inf"])
def test_infinite_and_nan_floats_are_refused(tmp_path: Path, value: str) -> None:
    """`session_timeout = inf` passed `config check` and then `mqd run` died with OverflowError."""
    path = _write(tmp_path, f"[consumer]\nsession_timeout = {value}\n")
    assert "consumer.session_timeout" in _error(path)
    code, out = _check_exit(path)
    assert code == EXIT_CONFIG and "consumer.session_timeout" in out


def _float_fields(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every float key (optional ones included) of a model and its sections."""
    out: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_float_fields(ann, f"{prefix}{name}."))
        elif any(a is float or typing.get_args(a)[:1] == (float,) for a in args):
            out[f"{prefix}{name}"] = field
    return out


def _refuses_inf_nan(field: FieldInfo) -> bool:
    """The field's type carries allow_inf_nan=False (directly or inside an Optional)."""
    metadata = list(field.metadata)
    for a in typing.get_args(field.annotation):
        metadata.extend(typing.get_args(a)[1:])
    return any(getattr(m, "allow_inf_nan", None) is False for m in metadata)


def test_every_float_field_refuses_inf_and_nan(tmp_path: Path) -> None:
    """Every float key of every config model uses the finite type; in the daemon file each one
    refuses inf and nan with its key (not just the reproduced session_timeout)."""
    for model in (MqdConfig, BrokerConfig, ClusterConfig):
        for key, field in _float_fields(model).items():
            assert _refuses_inf_nan(field), f"{model.__name__}.{key} takes inf/nan"
    keys = _float_fields(MqdConfig)
    assert "consumer.session_timeout" in keys and "landing.max_age" in keys
    for key in keys:
        section, name = key.rsplit(".", 1)
        for value in ("inf", "nan"):
            msg = _error(_write(tmp_path, f"[{section}]\n{name} = {value}\n"))
            assert key in msg, (key, msg)


def test_session_timeout_above_the_brokers_limit_is_refused(tmp_path: Path) -> None:
    """The broker refuses a heartbeat over 3_600_000 ms; the config says so first."""
    assert load_daemon_config(_write(tmp_path, "[consumer]\nsession_timeout = 3600\n"), {})
    assert "consumer.session_timeout" in _error(_write(tmp_path, "[consumer]\nsession_timeout = 3600.5\n"))


def test_integers_beyond_64_bits_are_refused(tmp_path: Path) -> None:
    """TOML takes integers of any size; past 64 bits a ms value overflows a float or the broker's limit."""
    msg = _error(_write(tmp_path, f"[consumer]\nflow_control_retry_ms = {10**400}\n"))
    assert "consumer.flow_control_retry_ms" in msg
    assert load_daemon_config(_write(tmp_path, f"[consumer]\nfetch_max_bytes = {2**63 - 1}\n"), {})


# -- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["landing.dir", "daemon.state_dir", "daemon.pid_file", "consumer.offset_file", "spark.output_dir"]
)
def test_empty_paths_are_refused(tmp_path: Path, key: str) -> None:
    """An empty path is Path('.'): the landing silently became the config file's folder."""
    section, name = key.split(".")
    assert key in _error(_write(tmp_path, f'[{section}]\n{name} = ""\n'))


def test_empty_landing_dir_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    """`MQD_LANDING__DIR=""` was accepted and meant the config file's folder."""
    path = _write(tmp_path, "")
    msg = _error(path, {"MQD_LANDING__DIR": ""})
    assert "landing.dir: a path may not be empty" in msg
    assert "MQD_LANDING__DIR" in msg
    code, out = _check_exit(path, {"MQD_LANDING__DIR": ""})
    assert code == EXIT_CONFIG and "MQD_LANDING__DIR" in out


def test_empty_broker_paths_are_refused(tmp_path: Path) -> None:
    """A node's data_dir or TLS files may not be empty either."""
    _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://127.0.0.1:9401", role = "master"}]\n',
        "c.toml",
    )
    for key in ('data_dir = ""', 'data_dir = "d"\ntls_ca_file = ""'):
        path = _write(tmp_path, f'node_id = "n1"\ncluster_file = "c.toml"\n{key}\n', "n.toml")
        with pytest.raises(ConfigError, match="a path may not be empty"):
            load_broker_config(path)


# -- URLs and tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("ftp://127.0.0.1:9400", "http:// or https://"),
        (
            "127.0.0.1:9400",
            "mqd broker addresses are http:// URLs; for a Kafka cluster set consumer.source = 'kafka'",
        ),
        ("localhost:9092", "mqd broker addresses are http:// URLs"),
        ("http://", "needs a host"),
        ("http://:9400", "needs a host"),
        ("http://127.0.0.1:99999", "not a valid URL"),
        ("http://127.0.0.1:9400\n", "whitespace or control"),
        ("http://127.0.0.1:9400/?x=1", "no query or fragment"),
        ("http://127.0.0.1:9400/#top", "no query or fragment"),
    ],
)
def test_bootstrap_urls_must_be_http_with_a_host(tmp_path: Path, url: str, needle: str) -> None:
    """A bootstrap the client cannot call is a config error naming consumer.bootstrap."""
    path = _write(tmp_path, f'[consumer]\nbootstrap = ["http://127.0.0.1:9400", {url!r}]\n'.replace("'", '"'))
    msg = _error(path)
    assert "consumer.bootstrap.1" in msg and needle in msg, msg


def test_good_bootstrap_urls_still_load(tmp_path: Path) -> None:
    """http, https, IPv6 literals and names keep working."""
    urls = '["http://127.0.0.1:9400", "https://broker.example:443", "http://[::1]:9400", "http://b"]'
    cfg = load_daemon_config(_write(tmp_path, f"[consumer]\nbootstrap = {urls}\n"), {})
    assert len(cfg.consumer.bootstrap) == 4


def test_a_trailing_slash_is_dropped_from_broker_urls(tmp_path: Path) -> None:
    """The client appends /v1/... to a broker URL: with the slash kept, "http://host:9400/" sent
    every request to //v1/... and got 404s (a path prefix, as behind a proxy, is kept)."""
    urls = '["http://127.0.0.1:9400/", "https://b.example/mqd/"]'
    cfg = load_daemon_config(_write(tmp_path, f"[consumer]\nbootstrap = {urls}\n"), {})
    assert list(cfg.consumer.bootstrap) == ["http://127.0.0.1:9400", "https://b.example/mqd"]


def test_node_urls_in_the_cluster_layout_need_http_and_a_host(tmp_path: Path) -> None:
    """A layout node whose url has no host is refused like a bootstrap."""
    path = _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://", role = "master"}]\n',
        "c.toml",
    )
    with pytest.raises(ConfigError, match=r"groups\.0\.nodes\.0\.url: a broker URL needs a host"):
        load_cluster_config(path)


@pytest.mark.parametrize("token", ["abc\ndef", "abc def", "abc\t", "a\x00b", "a\x7fb", "\u2028x"])
def test_tokens_with_whitespace_or_control_characters_are_refused(tmp_path: Path, token: str) -> None:
    """A newline in a token splits the Authorization header; the token itself is never shown."""
    for section in ("consumer", "admin"):
        path = _write(tmp_path, f"[{section}]\nauth_token = {json.dumps(token)}\n")  # JSON escapes are TOML's
        msg = _error(path)
        assert f"{section}.auth_token" in msg and "whitespace or control" in msg
        assert "abc" not in msg


def test_token_with_a_newline_from_the_environment(tmp_path: Path) -> None:
    """The usual way a token arrives (systemd EnvironmentFile) is checked the same way."""
    msg = _error(_write(tmp_path, ""), {"MQD_CONSUMER__AUTH_TOKEN": "s3cret\n"})
    assert "consumer.auth_token" in msg and "MQD_CONSUMER__AUTH_TOKEN" in msg and "s3cret" not in msg


def test_broker_token_with_a_newline_is_refused(tmp_path: Path) -> None:
    """The broker's auth_token follows the same rule."""
    _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://127.0.0.1:9401", role = "master"}]\n',
        "c.toml",
    )
    path = _write(
        tmp_path, 'node_id = "n1"\ncluster_file = "c.toml"\ndata_dir = "d"\nauth_token = "a\\nb"\n', "n.toml"
    )
    with pytest.raises(ConfigError, match="auth_token: a token may not contain whitespace"):
        load_broker_config(path)


def test_tokens_that_are_numbers_still_come_from_the_environment_as_text(tmp_path: Path) -> None:
    """A token is text even when it looks like a number or a boolean."""
    cfg = load_daemon_config(
        _write(tmp_path, ""), {"MQD_CONSUMER__AUTH_TOKEN": "12345", "MQD_ADMIN__AUTH_TOKEN": "true"}
    )
    assert cfg.consumer.auth_token == "12345" and cfg.admin.auth_token == "true"


# -- consumer group -----------------------------------------------------------------------------------


@pytest.mark.parametrize("group", ["a/b", "..", "a b", "a?b", "x" * 256])
def test_groups_the_broker_cannot_route_are_refused(tmp_path: Path, group: str) -> None:
    """The group is a path segment of /v1/groups/<group>/...; the broker takes 1..255 characters."""
    assert "consumer.group" in _error(_write(tmp_path, f'[consumer]\ngroup = "{group}"\n'))


# -- environment ---------------------------------------------------------------------------------------


def test_single_underscore_override_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    """`MQD_CONSUMER_GROUP` was silently ignored."""
    path = _write(tmp_path, "")
    msg = _error(path, {"MQD_CONSUMER_GROUP": "etl"})
    assert "MQD_CONSUMER_GROUP: unknown MQD_ environment variable" in msg
    assert "did you mean MQD_CONSUMER__GROUP" in msg
    code, out = _check_exit(path, {"MQD_CONSUMER_GROUP": "etl"})
    assert code == EXIT_CONFIG and "did you mean MQD_CONSUMER__GROUP" in out


def test_unknown_variables_are_reported_with_file_errors(tmp_path: Path) -> None:
    """Every problem at once: a bad key in the file and a stray variable."""
    msg = _error(_write(tmp_path, "[consumer]\ngroupp = 1\n"), {"MQD_LANDNG_DIR": "x", "MQD_WHATEVER": "1"})
    assert "consumer.groupp: unknown key" in msg
    assert "MQD_LANDNG_DIR: unknown" in msg and "MQD_WHATEVER: unknown" in msg


def test_variables_that_are_not_overrides_keep_working(tmp_path: Path) -> None:
    """MQD_CONFIG, MQD_TOKEN (CLI), MQD_BIN (installer), the bench's and chaos tool's variables."""
    env: dict[str, Any] = {
        "MQD_CONFIG": "/etc/mqd/mqd.toml",
        "MQD_TOKEN": "t",
        "MQD_BIN": "/opt/mqd/bin/mqd",
        "MQD_BENCH_SINK_BYTES_PER_S": "5000000",
        "MQD_CHAOS_MOUNT_NS": "1",
        "MQD_CONSUMER__GROUP": "etl",
        "OTHER_MQD_X": "not ours",
    }
    assert load_daemon_config(_write(tmp_path, ""), env).consumer.group == "etl"


# -- topics --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["..", "../../etc", ".", "a/b", "x" * 250, ""])
def test_subscribed_topics_follow_the_topic_rule(tmp_path: Path, topic: str) -> None:
    """The landing put the raw topic into _state/<t>/: '..' and '../../etc' were accepted."""
    path = _write(tmp_path, f'[consumer]\ntopics = ["events", "{topic}"]\n')
    assert "consumer.topics.1" in _error(path)
    code, _ = _check_exit(path)
    assert code == EXIT_CONFIG


@pytest.mark.parametrize("topic", ["..", ".", "x" * 250])
def test_layout_topics_follow_the_topic_rule(tmp_path: Path, topic: str) -> None:
    """The broker's layout pattern allowed '.' and '..' (a data dir '..-0')."""
    path = _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://127.0.0.1:9401", role = "master"}]\n'
        f'[[topics]]\nname = "{topic}"\npartitions = 1\n',
        "c.toml",
    )
    with pytest.raises(ConfigError, match=r"topics\.0\.name"):
        load_cluster_config(path)


# -- broker node values the node would refuse at start ---------------------------------------------


@pytest.mark.parametrize(
    ("line", "needle"),
    [("port = 70000", "port"), ("port = -1", "port"), ('log_level = "loud"', "unknown log level")],
)
def test_broker_values_the_node_refuses_at_start(tmp_path: Path, line: str, needle: str) -> None:
    """A port outside 0..65535 or an unknown log level made `mqd broker` die with a traceback."""
    _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://127.0.0.1:9401", role = "master"}]\n',
        "c.toml",
    )
    path = _write(tmp_path, f'node_id = "n1"\ncluster_file = "c.toml"\ndata_dir = "d"\n{line}\n', "n.toml")
    with pytest.raises(ConfigError, match=needle):
        load_broker_config(path)
    code, _ = _check_exit(path)
    assert code == EXIT_CONFIG


def test_broker_log_level_takes_what_the_node_takes(tmp_path: Path) -> None:
    """Level names are case-insensitive, as the node's logging setup reads them."""
    _write(
        tmp_path,
        '[[groups]]\nname = "g"\nnodes = [{id = "n1", url = "http://127.0.0.1:9401", role = "master"}]\n',
        "c.toml",
    )
    for level in ("debug", "INFO", "Warning", "error"):
        path = _write(
            tmp_path,
            f'node_id = "n1"\ncluster_file = "c.toml"\ndata_dir = "d"\nlog_level = "{level}"\n',
            "n.toml",
        )
        assert load_broker_config(path)[0].log_level == level


def test_unknown_section_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    """MQD_CONSUMR__GROUP: the unknown section is reported with the variable that made it."""
    msg = _error(_write(tmp_path, ""), {"MQD_CONSUMR__GROUP": "x"})
    assert "consumr: unknown key" in msg and "[from environment variable MQD_CONSUMR__GROUP]" in msg


# -- group protocol and schema registry ------------------------------------------------------------


def test_an_mqd_allocation_under_the_kip848_protocol_is_refused_saying_why(tmp_path: Path) -> None:
    """Under group_protocol = "consumer" the broker assigns: an explicit consumer.allocation would
    be ignored, so config check refuses it and points at kafka.remote_assignor."""
    path = _write(
        tmp_path,
        '[consumer]\nsource = "kafka"\nbootstrap = ["127.0.0.1:9092"]\nallocation = "sticky"\n'
        '[consumer.kafka]\ngroup_protocol = "consumer"\n',
    )
    msg = _error(path)
    assert "broker assigns" in msg and "remote_assignor" in msg, msg
    code, out = _check_exit(path)
    assert code == EXIT_CONFIG and "allocation" in out


def test_a_remote_assignor_needs_the_consumer_protocol(tmp_path: Path) -> None:
    """remote_assignor under the classic protocol would do nothing: refused, naming both keys."""
    path = _write(
        tmp_path,
        '[consumer]\nsource = "kafka"\nbootstrap = ["127.0.0.1:9092"]\n'
        '[consumer.kafka]\nremote_assignor = "range"\n',
    )
    msg = _error(path)
    assert "consumer.kafka" in msg and "group_protocol" in msg, msg


@pytest.mark.parametrize("key", ["value_format", "key_format"])
@pytest.mark.parametrize("fmt", ["avro", "json_schema", "protobuf"])
def test_a_registry_format_without_a_registry_names_the_key(tmp_path: Path, key: str, fmt: str) -> None:
    """A registry format without [spark.schema_registry] is refused by config check, which never
    contacts a registry (there is none to contact)."""
    path = _write(tmp_path, f'[spark]\n{key} = "{fmt}"\n')
    msg = _error(path)
    assert f'{key} = "{fmt}"' in msg and "[spark.schema_registry]" in msg, msg


def test_registry_url_is_one_or_many_http_urls(tmp_path: Path) -> None:
    """url takes a string or a list; anything but an http(s) URL with a host is refused by index."""
    one = _write(
        tmp_path, '[spark]\nvalue_format = "avro"\n[spark.schema_registry]\nurl = "http://127.0.0.1:8081"\n'
    )
    assert load_daemon_config(one).spark.schema_registry is not None
    assert load_daemon_config(one).spark.schema_registry.url == ["http://127.0.0.1:8081"]  # type: ignore[union-attr]
    bad = _write(
        tmp_path,
        '[spark]\nvalue_format = "avro"\n[spark.schema_registry]\nurl = ["http://a:1", "ftp://b"]\n',
    )
    msg = _error(bad)
    assert "spark.schema_registry.url.1" in msg and "http:// or https://" in msg, msg
    both = _write(
        tmp_path,
        '[spark]\nvalue_format = "avro"\n[spark.schema_registry]\nurl = "http://a:1"\nusername = "u"\n',
    )
    assert "username and password go together" in _error(both)
