"""The Kafka chaos run under KIP-848's consumer group protocol (``--group-protocol consumer``): what
the daemons' config says (mqd's own loader accepts it), what the brokers are told, how long a daemon
freeze holds, and the combinations refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mqd_dev.chaos.__main__ import _parser
from mqd_dev.chaos.apache_kafka import GROUP_SESSION_S, ApacheKafka, consumer_group_settings
from mqd_dev.chaos.kafka_source import KafkaChaosRun
from mqd_dev.chaos.runner import APACHE_KAFKA_KINDS, KAFKA_KINDS, ChaosOptions

from mqd.config import ConfigError, MqdConfig, load_daemon_config
from mqd.testing import to_toml


def _run(tmp_path: Path, protocol: str, seed: int = 1) -> KafkaChaosRun:
    return KafkaChaosRun(
        ChaosOptions(
            root=tmp_path,
            seed=seed,
            source="kafka",
            kafka_broker="apache",
            kinds=APACHE_KAFKA_KINDS,
            group_protocol=protocol,
        )
    )


def _loaded(tmp_path: Path, run: KafkaChaosRun) -> tuple[dict[str, Any], MqdConfig]:
    """Daemon 0's config as the harness builds it, and as ``mqd run`` would load it."""
    body = run.daemon_config(run.daemons[0])
    path = tmp_path / "d0.toml"
    path.write_text(to_toml(body))
    return body, load_daemon_config(path)


def test_consumer_protocol_config_names_the_protocol_and_no_allocation(tmp_path: Path) -> None:
    """``--group-protocol consumer``: every daemon's config has ``consumer.kafka.group_protocol =
    "consumer"``, keeps its static instance id, and sets no ``consumer.allocation`` (config check
    refuses one under this protocol); mqd's loader accepts the file as written."""
    run = _run(tmp_path, "consumer")
    body, cfg = _loaded(tmp_path, run)
    assert body["consumer.kafka"] == {"group_instance_id": "d0", "group_protocol": "consumer"}
    assert "allocation" not in body["consumer"]
    consumer = cfg.consumer
    assert consumer.source == "kafka"
    assert consumer.kafka.group_protocol == "consumer"
    assert consumer.kafka.group_instance_id == "d0"
    assert "allocation" not in consumer.model_fields_set
    for d in [*run.daemons, run.extra]:
        assert run.daemon_config(d)["consumer.kafka"] == {
            "group_instance_id": d.name,
            "group_protocol": "consumer",
        }


def test_classic_config_is_unchanged(tmp_path: Path) -> None:
    """The default (classic) writes the config it always did: no group_protocol key at all."""
    body, cfg = _loaded(tmp_path, _run(tmp_path, "classic"))
    assert body["consumer.kafka"] == {"group_instance_id": "d0"}
    assert cfg.consumer.kafka.group_protocol == "classic"


def test_the_consumer_protocol_config_with_an_allocation_is_what_config_check_refuses(
    tmp_path: Path,
) -> None:
    """Why the harness leaves ``consumer.allocation`` out: mqd refuses it under the protocol."""
    run = _run(tmp_path, "consumer")
    body = run.daemon_config(run.daemons[0])
    body["consumer"] = {**body["consumer"], "allocation": "averagely"}
    path = tmp_path / "bad.toml"
    path.write_text(to_toml(body))
    with pytest.raises(ConfigError, match="allocation"):
        load_daemon_config(path)


def test_brokers_get_a_short_consumer_group_session_only_under_the_consumer_protocol(
    tmp_path: Path,
) -> None:
    """The coordinator's KIP-848 session and heartbeat are lowered (and their floors, which Kafka
    keeps at 45 s and 5 s) for a consumer-protocol run, above the daemons' 3 s session; a classic
    run's server.properties say nothing of them."""
    s = consumer_group_settings("consumer")
    assert s["group.consumer.session.timeout.ms"] == str(int(GROUP_SESSION_S * 1000))
    assert int(s["group.consumer.min.session.timeout.ms"]) <= GROUP_SESSION_S * 1000
    heartbeat = int(s["group.consumer.heartbeat.interval.ms"])
    assert int(s["group.consumer.min.heartbeat.interval.ms"]) <= heartbeat
    assert GROUP_SESSION_S > ChaosOptions(root=tmp_path).session_timeout
    assert consumer_group_settings("classic") == {}
    with pytest.raises(ValueError, match="classic or consumer"):
        consumer_group_settings("eager")
    kip848 = ApacheKafka(tmp_path / "a", seed=1, group_protocol="consumer")
    classic = ApacheKafka(tmp_path / "b", seed=1)
    for b in kip848.cluster.brokers:
        props = kip848.cluster.server_properties(b.index)
        assert props["group.consumer.session.timeout.ms"] == str(int(GROUP_SESSION_S * 1000))
    assert "group.consumer.session.timeout.ms" not in classic.cluster.server_properties(1)
    assert "KIP-848" in kip848.describe() and "classic" in classic.describe()


def test_daemon_freezes_outlive_the_coordinators_session(tmp_path: Path) -> None:
    """Under the consumer protocol a frozen daemon's partitions move only once the broker's session
    ends: every planned freeze holds past it; the plans themselves are the classic run's."""
    kip848 = _run(tmp_path, "consumer", seed=9)
    classic = _run(tmp_path, "classic", seed=9)
    plans = [(kip848._plan_round(), classic._plan_round()) for _ in range(200)]
    freezes = [p for p, _ in plans if "daemon_freeze" in p[0]]
    assert freezes and all(hold >= GROUP_SESSION_S * 1.5 + 0.5 for _, hold in freezes)
    assert [k for (k, _), _c in plans] == [k for _p, (k, _) in plans]


def test_the_option_and_the_combinations_refused(tmp_path: Path) -> None:
    """``--group-protocol`` defaults to classic; consumer is refused with the mqd brokers and with
    Tansu (no ConsumerGroupHeartbeat), and an unknown protocol by name."""
    assert _parser().parse_args([]).group_protocol == "classic"
    assert _parser().parse_args(["--group-protocol", "consumer"]).group_protocol == "consumer"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--group-protocol", "eager"])
    with pytest.raises(ValueError, match="--source kafka"):
        ChaosOptions(root=tmp_path, group_protocol="consumer").validate()
    with pytest.raises(ValueError, match="Tansu"):
        ChaosOptions(
            root=tmp_path, source="kafka", kafka_broker="tansu", kinds=KAFKA_KINDS, group_protocol="consumer"
        ).validate()
    with pytest.raises(ValueError, match="classic or consumer"):
        ChaosOptions(root=tmp_path, source="kafka", kafka_broker="apache", group_protocol="eager").validate()
