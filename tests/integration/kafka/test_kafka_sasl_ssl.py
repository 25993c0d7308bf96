"""mqd's daemon against Apache Kafka whose clients' listener is SASL_SSL (issue 28): SCRAM users and
a CA made by :class:`mqd.testing.KafkaCluster` at start, records produced over SASL_SSL by
confluent-kafka, landed by the daemon logged in with SCRAM-SHA-512 (and -256); a wrong password and
a CA that did not sign the broker's certificate are errors that say so, land nothing and end the
start instead of retrying it."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce
from support.servers import serving

from mqd.consumer.errors import ConsumerError
from mqd.process.daemon import Daemon
from mqd.testing import KafkaCluster, KafkaSecurity
from mqd.testing.certificates import generate_certificates
from mqd.testing.maven import java_binary

pytest.importorskip("confluent_kafka")

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One SASL_SSL broker for the module (users alice and bob, SCRAM-SHA-512 and -256); its log is
    printed at teardown when a test failed meanwhile."""
    with serving(
        request, KafkaCluster(tmp_path_factory.mktemp("kafka-sasl-ssl"), security=KafkaSecurity(users=USERS))
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The certificate of a CA made the same way that did not sign the broker's certificate."""
    return generate_certificates(tmp_path_factory.mktemp("other-ca"), java=java_binary()).ca_file


def secured_produce(kafka: KafkaCluster, records: list[Produced], topic: str, user: str = "alice") -> None:
    """``records`` produced by confluent-kafka over the cluster's SASL_SSL listener as ``user``."""
    settings: dict[str, Any] = kafka.client_config(user)
    produce(settings.pop("bootstrap.servers"), records, topic=topic, **settings)


def tls_handshake(port: int, ca_file: Path, server_name: str = "127.0.0.1") -> dict[str, Any]:
    """A TLS handshake with 127.0.0.1:``port`` verifying against ``ca_file``: the peer certificate."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return cert


def test_the_listener_is_tls_with_a_certificate_the_ca_signed(kafka: KafkaCluster, other_ca: Path) -> None:
    """The clients' listener answers a TLS handshake whose chain verifies against ``ca_file`` for
    127.0.0.1 and localhost (OpenSSL's verification, Python's ssl module), and not against another
    CA; the cluster's own admin still works on its PLAINTEXT listener."""
    assert kafka.ca_file is not None and kafka.users == USERS
    port = kafka.brokers[0].port
    for name in ("127.0.0.1", "localhost"):
        cert = tls_handshake(port, kafka.ca_file, name)
        assert ("commonName", "localhost") in cert["subject"][0]
        assert ("IP Address", "127.0.0.1") in cert["subjectAltName"]
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_handshake(port, other_ca)
    assert kafka.plaintext_bootstrap != kafka.bootstrap
    kafka.create_topic("admin-check", 2)
    assert kafka.leader("admin-check", 1) == 0


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
async def test_daemon_lands_records_produced_over_sasl_ssl_exactly_once(
    kafka: KafkaCluster, mechanism: str, tmp_path: Path
) -> None:
    """3,000 records on 3 partitions produced over SASL_SSL (confluent-kafka, alice, SCRAM-SHA-512)
    -> burst daemon with security_protocol SASL_SSL, ``mechanism`` as bob, tls_ca_file the cluster's
    CA -> Parquet: every record once, in offset order per partition, values as produced."""
    topic = f"secured-{mechanism.lower()}"
    kafka.create_topic(topic, 3)
    records: list[Produced] = [(i % 3, b"k%d" % i, b"v%d" % i, []) for i in range(3000)]
    secured_produce(kafka, records, topic)
    settings = kafka.mqd_kafka_settings("bob", mechanism=mechanism)
    assert settings["security_protocol"] == "SASL_SSL" and settings["sasl_mechanism"] == mechanism
    config = kafka_daemon_config(kafka.bootstrap, tmp_path, topic=topic, consumer={"kafka": settings})
    d = Daemon(config, burst=True)
    await asyncio.wait_for(d.run(), 90)
    assert d.state == "stopped" and d.stats["records_published"] == 3000
    got = landed_rows(tmp_path / "landing")
    for p in range(3):
        rows = sorted(got[p])
        assert [r[0] for r in rows] == list(range(1000)), f"partition {p}: offsets lost or duplicated"
        assert [r[2] for r in rows] == [v for q, _, v, _ in records if q == p], (
            f"partition {p}: values differ"
        )


async def test_a_wrong_password_is_an_authentication_error(kafka: KafkaCluster, tmp_path: Path) -> None:
    """The daemon with alice's name and a wrong password: its start fails with an error naming the
    SASL authentication, the mechanism and the user, within a second or two (no retrying until
    request_timeout: a password does not get right by waiting), and nothing lands."""
    topic = "secured-wrong-password"
    kafka.create_topic(topic, 1)
    secured_produce(kafka, [(0, None, b"x", [])], topic)
    settings = kafka.mqd_kafka_settings("alice", password="not-alices")
    config = kafka_daemon_config(
        kafka.bootstrap, tmp_path, topic=topic, consumer={"kafka": settings, "request_timeout": 20.0}
    )
    d = Daemon(config, burst=True)
    started = time.monotonic()
    with pytest.raises(ConsumerError) as info:
        await asyncio.wait_for(d.run(), 60)
    took = time.monotonic() - started
    message = str(info.value)
    assert "authentication failed" in message.lower() and "SCRAM-SHA-512" in message and "alice" in message
    assert not info.value.retriable
    assert took < 10.0, f"{took:.1f} s: the start retried a failed authentication"
    assert d.state == "failed"
    assert not list((tmp_path / "landing").rglob("*.parquet"))


async def test_a_ca_that_did_not_sign_the_broker_is_a_tls_error(
    kafka: KafkaCluster, other_ca: Path, tmp_path: Path
) -> None:
    """The daemon trusting another CA: its start fails with an error naming the TLS certificate
    verification and the CA file, without retrying until request_timeout, and nothing lands."""
    topic = "secured-wrong-ca"
    kafka.create_topic(topic, 1)
    secured_produce(kafka, [(0, None, b"x", [])], topic)
    settings = {**kafka.mqd_kafka_settings("alice"), "tls_ca_file": str(other_ca)}
    config = kafka_daemon_config(
        kafka.bootstrap, tmp_path, topic=topic, consumer={"kafka": settings, "request_timeout": 20.0}
    )
    d = Daemon(config, burst=True)
    started = time.monotonic()
    with pytest.raises(ConsumerError) as info:
        await asyncio.wait_for(d.run(), 60)
    took = time.monotonic() - started
    message = str(info.value)
    assert "certificate verify failed" in message and str(other_ca) in message
    assert not info.value.retriable
    assert took < 10.0, f"{took:.1f} s: the start retried a failed certificate verification"
    assert d.state == "failed"
    assert not list((tmp_path / "landing").rglob("*.parquet"))
