"""The mqd HTTP broker as a consumer source: metadata cache, fetch, offset lookups, the consumer
group's coordinator/heartbeats and its broker offset store."""

from mqd.sources.mqd_broker.coordinator import GroupCoordinator
from mqd.sources.mqd_broker.metadata_cache import MetadataCache
from mqd.sources.mqd_broker.offset_store import BrokerOffsetStore
from mqd.sources.mqd_broker.source import MqdBrokerSource

__all__ = ["BrokerOffsetStore", "GroupCoordinator", "MetadataCache", "MqdBrokerSource"]
