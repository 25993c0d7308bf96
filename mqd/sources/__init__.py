"""Sources: implementations of the consumer engine's source seam (mqd.consumer.source.Source).

:func:`open_source` is where a source is chosen and built, from ``consumer.source``: the engine
(mqd.consumer) names no implementation; its callers build the source and hand it in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mqd.config import ConsumerConfig
    from mqd.consumer.source import Source

__all__ = ["open_source"]


def open_source(config: ConsumerConfig, *, client: object | None = None) -> Source:
    """The source ``config.source`` names, not started (``start``/``stop`` are the caller's, or the
    Consumer's it is handed to). ``client``: a started mqd.wire.client.BrokerClient the mqd broker's
    source shares instead of building its own (the caller starts and closes it); a Kafka source has
    its own connections and ignores it. The implementations are imported here only, lazily (the
    Kafka source pulls in aiokafka)."""
    if config.source == "kafka":
        from mqd.sources.kafka.source import KafkaSource

        return KafkaSource(config)
    from mqd.sources.mqd_broker import MqdBrokerSource
    from mqd.wire.client import BrokerClient

    if client is not None and not isinstance(client, BrokerClient):
        raise TypeError(f"client: expected a mqd.wire.client.BrokerClient, got {type(client).__name__}")
    return MqdBrokerSource(config, client=client)
