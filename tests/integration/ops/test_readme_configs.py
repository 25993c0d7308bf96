"""The config files the README shows are valid as printed: a user who copies one gets a file that
`mqd config check` accepts, and without the secret it names the missing key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import REPO_ROOT


def _toml_block_after(heading: str) -> str:
    text: str = (REPO_ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    block: str = section.split("```toml\n", 1)[1].split("```", 1)[0]
    return block


def _check(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MQD_")}
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )


def test_the_consume_from_kafka_config_checks_with_its_password_from_the_environment(tmp_path: Path) -> None:
    """The "Consume from Kafka" file passes `mqd config check` with MQD_CONSUMER__KAFKA__SASL_PASSWORD
    set (its TLS file present), and exits 2 naming sasl_password without it."""
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "kafka-ca.pem").write_text("placeholder\n")
    config = tmp_path / "mqd.toml"
    config.write_text(_toml_block_after("Consume from Kafka"))

    ok = _check(config, MQD_CONSUMER__KAFKA__SASL_PASSWORD="s3cret")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    missing = _check(config)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "sasl_password" in missing.stdout + missing.stderr
