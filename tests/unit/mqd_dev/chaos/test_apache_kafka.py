"""The Apache Kafka chaos variant's pure logic (``--source kafka``, issue 28): where the topic's
replicas go, the listeners that send every client through its broker's proxy, who is killed and who
is elected in an unclean election, which kinds a run plans, and what ``--source`` means."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from mqd_dev.chaos.__main__ import _parser, source_choice
from mqd_dev.chaos.apache_kafka import (
    ApacheKafka,
    client_listener_settings,
    data_brokers,
    replica_assignment,
    unclean_roles,
)
from mqd_dev.chaos.kafka_source import KafkaChaosRun
from mqd_dev.chaos.runner import (
    APACHE_KAFKA_KINDS,
    KAFKA_KINDS,
    ChaosOptions,
    expand_kinds,
)


def test_the_topic_lives_on_the_three_brokers_each_leading_some_partition() -> None:
    """Replication 3 on brokers 1-3 (never the controller node 0), the preferred leader rotating."""
    brokers = data_brokers()
    assert brokers == [1, 2, 3]
    got = replica_assignment(4, brokers)
    assert got == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]
    assert all(sorted(r) == brokers for r in got)
    assert {r[0] for r in got} == set(brokers)


def test_clients_are_told_the_proxy_and_brokers_replicate_directly() -> None:
    """The CLIENT listener is advertised at the proxy's port (a client reconnects to what the
    metadata names); PLAINTEXT, which the brokers and the harness use, is advertised as itself; a
    controller keeps its own listener, unadvertised."""
    s = client_listener_settings(9001, 9002, 9003, 9004)
    assert s["listeners"] == (
        "PLAINTEXT://127.0.0.1:9001,CLIENT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9004"
    )
    assert s["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9001,CLIENT://127.0.0.1:9003"
    assert "CLIENT:PLAINTEXT" in s["listener.security.protocol.map"]
    assert "CONTROLLER" not in client_listener_settings(1, 2, 3, None)["listeners"]


def test_the_cluster_config_routes_clients_through_one_proxy_per_node(tmp_path: Path) -> None:
    """Four nodes, node 0 the only controller voter; each node's server.properties advertises its
    own proxy; the daemons' bootstrap is the proxies, the harness's the brokers themselves."""
    kafka = ApacheKafka(tmp_path, seed=1)
    cluster = kafka.cluster
    assert len(cluster.brokers) == 4 and kafka.data == [1, 2, 3]
    for b in cluster.brokers:
        props = cluster.server_properties(b.index)
        proxy = kafka.proxies[b.index]
        assert proxy.target_port == kafka.client_ports[b.index]
        assert f"CLIENT://127.0.0.1:{proxy.listen_port}" in props["advertised.listeners"]
        assert props["inter.broker.listener.name"] == "PLAINTEXT"
        assert props["process.roles"] == ("broker,controller" if b.index == 0 else "broker")
        assert props["controller.quorum.voters"] == f"0@127.0.0.1:{cluster.brokers[0].controller_port}"
    assert kafka.bootstrap.split(",") == [f"127.0.0.1:{p.listen_port}" for p in kafka.proxies.values()]
    assert kafka.check_bootstrap == cluster.bootstrap


def test_unclean_roles_are_the_leaders_two_followers_in_a_seeded_order() -> None:
    """The stale replica (killed first) and the elected one (killed second) are the two followers;
    the same seed picks the same order, and both orders occur."""
    orders = {unclean_roles([1, 2, 3], 2, random.Random(seed)) for seed in range(20)}
    assert orders == {(1, 3), (3, 1)}
    assert unclean_roles([1, 2, 3], 2, random.Random(7)) == unclean_roles([3, 2, 1], 2, random.Random(7))
    with pytest.raises(ValueError, match="two followers"):
        unclean_roles([1, 2], 1, random.Random(0))


def test_apache_kafka_plans_draw_its_kinds_and_freezes_outlive_the_broker_session(tmp_path: Path) -> None:
    """Over 200 planned rounds an Apache Kafka run draws each of its kinds and no Tansu or mqd-broker
    kind, at most one broker fault per round; a broker freeze holds past the 3 s broker session."""
    opts = ChaosOptions(
        root=tmp_path,
        seed=5,
        faults_per_round=3,
        source="kafka",
        kafka_broker="apache",
        kinds=APACHE_KAFKA_KINDS,
    )
    run = KafkaChaosRun(opts)
    plans = [run._plan_round() for _ in range(200)]
    assert {k for kinds, _ in plans for k in kinds} == set(APACHE_KAFKA_KINDS)
    broker = set(expand_kinds("broker", "kafka", "apache"))
    assert all(len(broker & set(kinds)) <= 1 for kinds, _ in plans)
    assert all(hold >= 5.0 for kinds, hold in plans if "kafka_broker_freeze" in kinds)
    assert broker == {
        "kafka_broker_kill",
        "kafka_leader_kill",
        "kafka_broker_freeze",
        "kafka_unclean_election",
    }
    assert expand_kinds("all", "kafka", "apache") == APACHE_KAFKA_KINDS
    with pytest.raises(ValueError, match="tansu_kill"):
        ChaosOptions(root=tmp_path, source="kafka", kafka_broker="apache", kinds=("tansu_kill",)).validate()
    with pytest.raises(ValueError, match="kafka_broker_kill"):
        ChaosOptions(
            root=tmp_path, source="kafka", kafka_broker="tansu", kinds=("kafka_broker_kill",)
        ).validate()


def test_the_same_seed_plans_the_same_apache_rounds(tmp_path: Path) -> None:
    def plan() -> list[tuple[list[str], float]]:
        opts = ChaosOptions(
            root=tmp_path, seed=42, source="kafka", kafka_broker="apache", kinds=APACHE_KAFKA_KINDS
        )
        run = KafkaChaosRun(opts)
        return [run._plan_round() for _ in range(20)]

    assert plan() == plan()


def test_source_kafka_is_apache_kafka_and_tansu_is_an_option() -> None:
    """``--source kafka`` (``make chaos SOURCE=kafka``) runs Apache Kafka, ``--source tansu`` Tansu
    with its own kinds; ``--source mqd`` the mqd brokers."""
    assert source_choice("kafka") == ("kafka", "apache")
    assert source_choice("tansu") == ("kafka", "tansu")
    assert source_choice("mqd")[0] == "mqd"
    assert _parser().parse_args(["--source", "tansu"]).source == "tansu"
    assert expand_kinds("all", *source_choice("tansu")) == KAFKA_KINDS
    assert expand_kinds("broker", *source_choice("kafka"))[0] == "kafka_broker_kill"
