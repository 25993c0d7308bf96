"""The consumer engine: metadata, group membership, rebalance, node-grouped fetching, offsets.

The daemon uses :class:`Consumer`; the rest is exported for tools and tests.
"""

from mqd.consumer.allocation import (
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    get_strategy,
    make_consistent_hash,
    register_strategy,
    strategy_names,
)
from mqd.consumer.consumer import Consumer, RebalanceListener, StartPositionHook
from mqd.consumer.offsets import BrokerOffsetStore, LocalFileOffsetStore, OffsetStore
from mqd.consumer.state import (
    ConsumerError,
    FetchedBatch,
    FlowLimits,
    NotAssignedError,
    ProcessQueue,
    SubscriptionState,
    TopicPartition,
)

__all__ = [
    "BrokerOffsetStore",
    "Consumer",
    "ConsumerError",
    "FetchedBatch",
    "FlowLimits",
    "LocalFileOffsetStore",
    "NotAssignedError",
    "OffsetStore",
    "ProcessQueue",
    "RebalanceListener",
    "StartPositionHook",
    "SubscriptionState",
    "TopicPartition",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "allocate_consistent_hash",
    "get_strategy",
    "make_consistent_hash",
    "register_strategy",
    "strategy_names",
]
