"""Config files: the shipped mqd.toml, strict validation with useful messages, MQD_* overrides."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import REPO_ROOT
from support.config import config_error as _error
from support.config import write_file as _write

from mqd.config import (
    ConfigError,
    MqdConfig,
    check_file,
    detect_kind,
    load_daemon_config,
)

ROOT = REPO_ROOT
SHIPPED = ROOT / "config" / "mqd.toml"


# -- the shipped file ------------------------------------------------------------------------------


def test_shipped_file_is_valid_and_all_defaults() -> None:
    """config/mqd.toml loads as is and, with nothing uncommented, equals the defaults."""
    cfg = load_daemon_config(SHIPPED, {})
    assert cfg.model_dump(
        exclude={"consumer": {"offset_file"}, "landing": {"dir"}, "spark": True, "daemon": True}
    ) == MqdConfig().model_dump(
        exclude={"consumer": {"offset_file"}, "landing": {"dir"}, "spark": True, "daemon": True}
    )


def test_shipped_file_comments_every_key_with_its_default() -> None:
    """Uncommenting every `# key = value` line yields exactly the model defaults, for every key."""
    section = None
    data: dict[str, dict[str, object]] = {}
    mentioned: dict[str, set[str]] = {}
    for line in SHIPPED.read_text().splitlines():
        if m := re.match(r"^\[(\w+)\]", line):
            section = m.group(1)
            data[section] = {}
            mentioned[section] = set()
        elif section and (m := re.match(r"^# (\w+) =(.*)$", line)):
            key, rest = m.group(1), m.group(2).split("  #")[0].strip()
            mentioned[section].add(key)
            examples = ("auth_token", "tls_ca_file", "kafka", "schema_registry")  # not defaults
            if rest and key not in examples:
                data[section][key] = tomllib.loads(f"v = {rest}")["v"]
    defaults = MqdConfig().model_dump(mode="json")
    assert set(mentioned) == set(defaults)
    for name, fields in defaults.items():
        assert mentioned[name] == set(fields), f"[{name}] keys missing from config/mqd.toml"
        for key, value in data[name].items():
            # read as the loader reads it: "20s" is the default 20.0 (issue 17's units syntax)
            read = getattr(MqdConfig.model_validate_json(json.dumps({name: {key: value}}), strict=True), name)
            default = getattr(getattr(MqdConfig(), name), key)
            assert getattr(read, key) == default, f"{name}.{key}: file says {value!r}, default is {default!r}"


# -- errors ----------------------------------------------------------------------------------------


def test_typo_key_names_file_key_path_suggestion_and_allowed_keys(tmp_path: Path) -> None:
    """An unknown key is refused with the file, the dotted key path, a suggestion and what is allowed."""
    path = _write(tmp_path, '[consumer]\ngrup = "etl"\n')
    msg = _error(path)
    assert str(path) in msg
    assert "consumer.grup: unknown key (did you mean 'group'?)" in msg
    assert "allowed keys:" in msg and "max_queued_records" in msg


def test_unknown_section_is_refused(tmp_path: Path) -> None:
    """A misspelt section is an unknown top-level key, listing the real sections."""
    msg = _error(_write(tmp_path, "[consumr]\ngroup = 'x'\n"))
    assert "consumr: unknown key (did you mean 'consumer'?)" in msg
    assert "admin, consumer, daemon, landing, log, spark" in msg


def test_wrong_type_is_refused_even_when_it_would_coerce(tmp_path: Path) -> None:
    """TOML has types: "1000" (a string) is not a number, and "yes" is not a boolean."""
    msg = _error(_write(tmp_path, '[consumer]\nmax_queued_records = "1000"\ncheck_crc = "yes"\n'))
    assert "consumer.max_queued_records: Input should be a valid integer (got '1000')" in msg
    assert "consumer.check_crc" in msg


def test_bad_values_say_what_is_allowed(tmp_path: Path) -> None:
    """Out-of-range numbers, bad choices and cross-field rules each get a line."""
    msg = _error(
        _write(
            tmp_path, '[consumer]\nmax_queued_records = 0\nconsume_from = "middle"\n[log]\nlevel = "loud"\n'
        )
    )
    assert "consumer.max_queued_records: Input should be greater than or equal to 1 (got 0)" in msg
    assert "consumer.consume_from: Input should be 'last', 'first' or 'timestamp'" in msg
    assert "log.level: Input should be 'debug', 'info', 'warning' or 'error' (got 'loud')" in msg
    msg = _error(_write(tmp_path, '[consumer]\nconsume_from = "timestamp"\n'))
    assert 'consume_from = "timestamp" needs consume_timestamp_ms' in msg
    msg = _error(_write(tmp_path, '[consumer]\nallocation = "round-robin"\n'))
    assert "unknown allocation strategy 'round-robin'; allowed: averagely" in msg


def test_missing_unreadable_and_malformed_files(tmp_path: Path) -> None:
    """Missing file, a directory and broken TOML each give a one-line reason naming the path."""
    assert _error(tmp_path / "nope.toml") == f"{tmp_path / 'nope.toml'}: config file not found"
    assert "is a directory" in _error(tmp_path)
    msg = _error(_write(tmp_path, "[consumer\n"))
    assert msg.startswith(f"{tmp_path / 'mqd.toml'}: not valid TOML")


def test_secrets_are_not_echoed(tmp_path: Path) -> None:
    """A bad or misspelt secret key never prints the secret."""
    msg = _error(_write(tmp_path, '[consumer]\nauth_tokn = "hunter2"\n[admin]\nauth_token = 5\n'))
    assert "hunter2" not in msg
    assert "consumer.auth_tokn: unknown key (did you mean 'auth_token'?)" in msg
    assert "<hidden>" in msg


# -- environment overrides ---------------------------------------------------------------------------


def test_env_overrides_take_types_from_the_model(tmp_path: Path) -> None:
    """Text fields take the value verbatim; numbers, booleans and lists take TOML syntax."""
    path = _write(tmp_path, '[consumer]\ngroup = "from-file"\n')
    cfg = load_daemon_config(
        path,
        {
            "MQD_CONSUMER__GROUP": "123",  # a text field: stays the string "123"
            "MQD_CONSUMER__TOPICS": '["a", "b"]',
            "MQD_CONSUMER__FETCH_MAX_WAIT_MS": "250",
            "MQD_CONSUMER__CHECK_CRC": "false",
            "MQD_CONSUMER__AUTH_TOKEN": "s3cret",
            "MQD_DAEMON__SHUTDOWN_TIMEOUT": "7.5",
            "MQD_LOG__LEVEL": "debug",
            "MQD_TOKEN": "ignored: no section",
            "OTHER__X": "ignored: not ours",
        },
    )
    assert cfg.consumer.group == "123"
    assert cfg.consumer.topics == ["a", "b"]
    assert cfg.consumer.fetch_max_wait_ms == 250
    assert cfg.consumer.check_crc is False
    assert cfg.consumer.auth_token == "s3cret"
    assert "s3cret" not in repr(cfg)
    assert cfg.daemon.shutdown_timeout == 7.5
    assert cfg.log.level == "debug"


def test_bad_env_override_names_the_variable(tmp_path: Path) -> None:
    """A bad value from the environment is reported with the variable it came from."""
    msg = _error(_write(tmp_path, ""), {"MQD_CONSUMER__FETCH_MAX_WAIT_MS": "soon", "MQD_CONSUMR__GROUP": "x"})
    assert "consumer.fetch_max_wait_ms: not a duration; use '500ms'" in msg
    assert "(got 'soon') [from environment variable MQD_CONSUMER__FETCH_MAX_WAIT_MS]" in msg
    assert "consumr: unknown key" in msg


@given(st.integers(min_value=1, max_value=2**40))
def test_env_integer_overrides_round_trip(n: int) -> None:
    """Any valid integer given through the environment arrives unchanged."""
    cfg = load_daemon_config(SHIPPED, {"MQD_CONSUMER__MAX_QUEUED_RECORDS": str(n)})
    assert cfg.consumer.max_queued_records == n


# -- paths and kinds --------------------------------------------------------------------------------


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    """Relative paths are taken from the config file's folder, absolute ones kept."""
    path = _write(tmp_path, '[daemon]\nstate_dir = "st"\npid_file = "/run/x.pid"\n[landing]\ndir = "../l"\n')
    cfg = load_daemon_config(path, {})
    assert cfg.daemon.state_dir == tmp_path / "st"
    assert cfg.daemon.pid_file == Path("/run/x.pid")
    assert cfg.landing.dir == tmp_path / "../l"


def test_pid_and_log_files_follow_state_dir(tmp_path: Path) -> None:
    """A second daemon on one host sets only state_dir: its pid and log files move with it, unless
    they are set themselves (environment overrides included)."""
    path = _write(tmp_path, '[daemon]\nstate_dir = "second"\n')
    cfg = load_daemon_config(path, {})
    assert cfg.daemon.pid_file == tmp_path / "second" / "mqd.pid"
    assert cfg.daemon.log_file == tmp_path / "second" / "mqd.log"
    cfg = load_daemon_config(path, {"MQD_DAEMON__LOG_FILE": "/var/log/mqd/second.log"})
    assert cfg.daemon.pid_file == tmp_path / "second" / "mqd.pid"
    assert cfg.daemon.log_file == Path("/var/log/mqd/second.log")
    assert MqdConfig().daemon.pid_file == Path("state/mqd.pid")


def test_config_is_frozen() -> None:
    """Models are immutable: a reload builds a new one."""
    cfg = MqdConfig()
    with pytest.raises(ValueError):
        cfg.consumer.group = "x"


def test_detect_kind_and_check_shipped_files() -> None:
    """check_file tells daemon, broker node and cluster layout files apart and validates each."""
    assert detect_kind({"node_id": "a"}) == "broker"
    assert detect_kind({"groups": []}) == "cluster"
    assert detect_kind({"consumer": {}}) == "daemon"
    assert check_file(SHIPPED, {})[0] == "daemon"
    for path in (ROOT / "config").glob("*.toml"):
        kind, _ = check_file(path, {})
        assert kind in ("daemon", "broker", "cluster")


def test_broker_file_errors_name_the_node_file(tmp_path: Path) -> None:
    """A broker node file with a typo is refused by check_file with its key path."""
    cluster = _write(
        tmp_path,
        '[[groups]]\nname = "a"\n[[groups.nodes]]\nid = "n0"\nurl = "http://127.0.0.1:1"\nrole = "master"\n',
        "cluster.toml",
    )
    node = _write(
        tmp_path,
        f'node_id = "n0"\ncluster_file = "{cluster.name}"\ndata_dir = "d"\n'
        "[storage]\nfsync = 'sometimes'\n",
        "node.toml",
    )
    with pytest.raises(ConfigError) as info:
        check_file(node)
    want = "storage.fsync: Input should be 'always', 'interval' or 'never' (got 'sometimes')"
    assert want in str(info.value)
    bad = _write(
        tmp_path,
        '[[groups]]\nname = "a"\n[[groups.nodes]]\nid = "n0"\nurl = "x"\nrole = "boss"\n',
        "cluster2.toml",
    )
    with pytest.raises(ConfigError) as info:
        check_file(bad)
    assert "groups.0.nodes.0.role" in str(info.value)
    assert "groups.0.nodes.0.url" in str(info.value)
