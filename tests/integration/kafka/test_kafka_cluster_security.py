"""KafkaCluster's other two secured listeners, end to end against Apache Kafka: TLS without SASL
(``SSL``) and SCRAM without TLS (``SASL_PLAINTEXT``). What a test author gets from
``client_config()`` and ``mqd_kafka_settings()`` works as it is for confluent-kafka and for mqd's
daemon, and a client that leaves the security out is not served on the clients' listener.
(SASL_SSL, the default, has its own module: test_kafka_sasl_ssl.py.)"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce

from mqd.process.daemon import Daemon
from mqd.testing import KafkaCluster, KafkaSecurity
from mqd.testing.kafka_cluster import SecurityProtocol

pytest.importorskip("confluent_kafka")


@pytest.mark.parametrize("protocol", ["SSL", "SASL_PLAINTEXT"])
async def test_records_produced_and_landed_over_the_secured_listener(
    protocol: SecurityProtocol, tmp_path: Path
) -> None:
    """A one-broker cluster with a ``protocol`` listener: 500 records produced with client_config()
    land exactly once through a burst daemon set up with mqd_kafka_settings() (a CA file for SSL, a
    SCRAM user for SASL_PLAINTEXT, nothing of the other), and a PLAINTEXT client on that listener
    gets no metadata."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    kafka = KafkaCluster(tmp_path / "kafka", security=KafkaSecurity(protocol, users={"carol": "carol-pw"}))
    try:
        await asyncio.to_thread(kafka.start)
        settings = kafka.mqd_kafka_settings()
        assert settings["security_protocol"] == protocol
        assert ("tls_ca_file" in settings) == (protocol == "SSL")
        assert ("sasl_username" in settings) == (protocol == "SASL_PLAINTEXT")
        kafka.create_topic("events", 2)
        records: list[Produced] = [(i % 2, None, b"%d" % i, []) for i in range(500)]
        client: dict[str, Any] = kafka.client_config()
        await asyncio.to_thread(produce, client.pop("bootstrap.servers"), records, **client)
        d = Daemon(kafka_daemon_config(kafka.bootstrap, tmp_path, consumer={"kafka": settings}), burst=True)
        await asyncio.wait_for(d.run(), 90)
        assert d.state == "stopped" and d.stats["records_published"] == 500
        got = landed_rows(tmp_path / "landing")
        for p in range(2):
            assert [(o, v) for o, _, v, _ in sorted(got[p])] == [
                (o, v) for o, (_, _, v, _) in enumerate(r for r in records if r[0] == p)
            ]
        plaintext = AdminClient({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
        with pytest.raises(KafkaException):  # the broker drops it: librdkafka sees a transport error
            plaintext.list_topics(timeout=2)
    except BaseException:
        print(kafka.dump_logs(), file=sys.stderr)
        raise
    finally:
        kafka.stop()
