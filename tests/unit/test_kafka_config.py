"""The Kafka part of the daemon config: consumer.source chooses the bootstrap form, [consumer.kafka]
is checked, and MQD_* variables reach nested keys (MQD_CONSUMER__KAFKA__SASL_PASSWORD)."""

from __future__ import annotations

from pathlib import Path

from support.config import config_error, write_file

from mqd.config import load_daemon_config

KAFKA = '[consumer]\nsource = "kafka"\nbootstrap = ["127.0.0.1:9092", "[::1]:9093"]\n'


def test_kafka_bootstrap_is_host_port(tmp_path: Path) -> None:
    """source = "kafka" takes HOST:PORT servers; the defaults of [consumer.kafka] apply."""
    cfg = load_daemon_config(write_file(tmp_path, KAFKA), {})
    assert cfg.consumer.source == "kafka"
    assert cfg.consumer.bootstrap == ["127.0.0.1:9092", "[::1]:9093"]
    assert cfg.consumer.kafka.isolation_level == "read_committed"
    assert cfg.consumer.kafka.security_protocol == "PLAINTEXT"


def test_kafka_bootstrap_refuses_urls_and_bad_ports(tmp_path: Path) -> None:
    """A URL or a missing/out-of-range port under source = "kafka" names the entry."""
    for bad, needle in (
        ("http://127.0.0.1:9092", "not a URL"),
        ("localhost", "HOST:PORT"),
        ("h:0", "1..65535"),
        # Kafka's bootstrap.servers spelling passed host "h1:9092,h2" and failed at connect time
        ("h1:9092,h2:9092", 'one server per entry: bootstrap = ["h1:9092", "h2:9092"]'),
    ):
        text = f'[consumer]\nsource = "kafka"\nmode = "broadcast"\nbootstrap = ["127.0.0.1:9092", "{bad}"]\n'
        msg = config_error(write_file(tmp_path, text))
        assert "consumer.bootstrap.1" in msg and needle in msg, msg


def test_mqd_source_still_wants_urls(tmp_path: Path) -> None:
    """The default source keeps refusing HOST:PORT, pointing at consumer.source."""
    msg = config_error(write_file(tmp_path, '[consumer]\nbootstrap = ["127.0.0.1:9092"]\n'))
    assert "consumer.bootstrap.0" in msg and "consumer.source = 'kafka'" in msg


def test_sasl_needs_credentials_and_tls_paths_resolve(tmp_path: Path) -> None:
    """SASL without a password is refused (hidden value); TLS files resolve next to the config."""
    text = KAFKA + '[consumer.kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_username = "u"\n'
    msg = config_error(write_file(tmp_path, text))
    assert "consumer.kafka" in msg and "sasl_password" in msg
    text += 'tls_ca_file = "tls/ca.pem"\n'
    cfg = load_daemon_config(write_file(tmp_path, text), {"MQD_CONSUMER__KAFKA__SASL_PASSWORD": "s3cret"})
    assert cfg.consumer.kafka.sasl_password == "s3cret"
    assert cfg.consumer.kafka.tls_ca_file == tmp_path / "tls" / "ca.pem"
    assert "s3cret" not in repr(cfg)


def test_static_membership_needs_an_instance_id(tmp_path: Path) -> None:
    """KIP-345 is opt-in and needs the member's static name; the error names the section and keys."""
    msg = config_error(write_file(tmp_path, KAFKA + "[consumer.kafka]\nstatic_membership = true\n"))
    assert "consumer.kafka" in msg and "static_membership needs a group_instance_id" in msg
    text = KAFKA + '[consumer.kafka]\nstatic_membership = true\ngroup_instance_id = "host-1"\n'
    kafka = load_daemon_config(write_file(tmp_path, text), {}).consumer.kafka
    assert kafka.static_membership and kafka.group_instance_id == "host-1"
    assert not load_daemon_config(write_file(tmp_path, KAFKA), {}).consumer.kafka.static_membership


def test_nested_variables_are_typed_and_named_in_errors(tmp_path: Path) -> None:
    """A nested override takes TOML syntax for non-text keys, and a bad one names the variable."""
    path = write_file(tmp_path, KAFKA)
    cfg = load_daemon_config(path, {"MQD_CONSUMER__KAFKA__TLS_CHECK_HOSTNAME": "false"})
    assert cfg.consumer.kafka.tls_check_hostname is False
    msg = config_error(path, {"MQD_CONSUMER__KAFKA__ISOLATION_LEVEL": "dirty"})
    assert "consumer.kafka.isolation_level" in msg and "MQD_CONSUMER__KAFKA__ISOLATION_LEVEL" in msg
    msg = config_error(path, {"MQD_CONSUMER__KAFKA__SASL_PASWORD": "x"})
    assert "consumer.kafka.sasl_pasword: unknown key (did you mean 'sasl_password'?)" in msg
    assert "(got <hidden>) [from environment variable MQD_CONSUMER__KAFKA__SASL_PASWORD]" in msg


def test_config_check_validates_the_kafka_settings(tmp_path: Path) -> None:
    """`mqd config check` passes a complete Kafka config (password from the environment) and exits 2
    naming the key for a bad one."""
    from click.testing import CliRunner

    from mqd.operator.cli import main

    text = (
        KAFKA + '[consumer.kafka]\nsecurity_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "SCRAM-SHA-512"\n'
    )
    text += 'sasl_username = "mqd"\n'
    path = write_file(tmp_path, text)
    ok = CliRunner().invoke(
        main, ["config", "check", str(path)], env={"MQD_CONSUMER__KAFKA__SASL_PASSWORD": "pw"}
    )
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(main, ["config", "check", str(path)], env={})
    assert bad.exit_code == 2 and "sasl_password" in bad.output
