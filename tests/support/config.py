"""Config files for loader tests: write one, and expect the loader to refuse it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqd.config import ConfigError, load_daemon_config


def write_file(tmp_path: Path, text: str, name: str = "mqd.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path, environ: dict[str, str] | None = None) -> str:
    """The loader's message for ``path`` (with ``environ`` as its MQD_* variables): a ConfigError
    that is not retriable and names the file."""
    with pytest.raises(ConfigError) as info:
        load_daemon_config(path, environ or {})
    assert info.value.retriable is False
    msg = str(info.value)
    assert str(path) in msg
    return msg
