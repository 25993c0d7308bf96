"""mqd.sources.open_source: the one place a source is chosen (consumer.source) and built."""

from __future__ import annotations

import pytest

from mqd.config import ConsumerConfig
from mqd.consumer import Consumer
from mqd.sources import open_source
from mqd.sources.kafka.source import KafkaSource
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.wire.client import BrokerClient


def test_mqd_source_by_default_with_its_own_client() -> None:
    source = open_source(ConsumerConfig(client_id="x"))
    assert isinstance(source, MqdBrokerSource)
    assert source.client is not None


def test_mqd_source_shares_a_given_client() -> None:
    client = BrokerClient(request_timeout=5)
    source = open_source(ConsumerConfig(client_id="x"), client=client)
    assert isinstance(source, MqdBrokerSource)
    assert source.client is client


def test_kafka_source() -> None:
    cfg = ConsumerConfig(client_id="x", source="kafka", bootstrap=["127.0.0.1:9092"])
    assert isinstance(open_source(cfg), KafkaSource)


def test_a_client_that_is_not_a_broker_client_is_refused() -> None:
    with pytest.raises(TypeError, match="BrokerClient"):
        open_source(ConsumerConfig(client_id="x"), client=object())


def test_the_consumer_takes_a_source_built_by_its_caller() -> None:
    cfg = ConsumerConfig(client_id="x")
    source = open_source(cfg)
    assert Consumer(cfg, source=source)._source is source
