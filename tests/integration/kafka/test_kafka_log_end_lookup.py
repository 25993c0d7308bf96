"""The log end of a Kafka partition (``KafkaSource.list_offsets(..., "latest")``, which the lag
poller, ``consume_from = "last"`` and the offset reset use) on a real broker whose last batch is
large. Tansu answers ListOffsets "latest" with the last batch's base offset + 1, so the source
confirms the end with a Fetch from there; that Fetch's answer holds the rest of the batch, and one
of 64 KiB or more is read in place (a raw answer). Proves the lookup parses such an answer and
gives the real end, where it failed with AttributeError on every poll before. (Apache Kafka answers
the exact end; the same lookup must give the same numbers there.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.kafka import Broker, kafka_daemon_config, produce

from mqd.sources.kafka.source import KafkaSource
from mqd.topic_partition import TopicPartition

pytest.importorskip("confluent_kafka")

RECORDS = 3_000  # ~300 KB in few batches: the confirming Fetch's answer is far above 64 KiB


async def test_the_log_end_behind_a_large_last_batch(broker: Broker, topic: str, tmp_path: Path) -> None:
    broker.create_topic(topic, 2)
    produce(broker.bootstrap, [(0, None, b"v%099d" % i, []) for i in range(RECORDS)], topic=topic)
    produce(broker.bootstrap, [(1, None, b"small", [])], topic=topic)
    source = KafkaSource(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic).consumer)
    await source.start(timeout=15)
    try:
        assert source.cluster is not None
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        node = source.cluster.partitions[tps[0]].leader
        assert await source.list_offsets(node, tps, "latest") == {tps[0]: RECORDS, tps[1]: 1}
        assert await source.list_offsets(node, tps, "earliest") == {tps[0]: 0, tps[1]: 0}
    finally:
        await source.stop()
