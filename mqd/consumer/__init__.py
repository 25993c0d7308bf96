"""The consumer engine: membership, rebalance, node-grouped fetching, process queues, the byte
budget, offsets; records come from a source (mqd.consumer.source; the mqd broker by default).

The daemon uses :class:`Consumer`; the rest is exported for tools and tests.
"""

from mqd.consumer.allocation import (
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    allocate_group,
    allocate_sticky,
    get_strategy,
    make_consistent_hash,
    register_strategy,
    strategy_names,
)
from mqd.consumer.budget import ByteBudget
from mqd.consumer.consumer import Consumer
from mqd.consumer.errors import ConsumerError, NotAssignedError
from mqd.consumer.membership import Broadcast
from mqd.consumer.offset_store import LocalFileOffsetStore, OffsetStore
from mqd.consumer.process_queue import FetchedBatch, FlowLimits, ProcessQueue
from mqd.consumer.rebalance import RebalanceListener, RebalanceService, StartPosition, StartPositionHook
from mqd.consumer.snapshot import ConsumerSnapshot, NodeSnapshot, PartitionSnapshot, consumer_status_json
from mqd.consumer.source import Membership, Source
from mqd.consumer.subscription_state import OwnedPartition, SubscriptionState
from mqd.topic_partition import TopicPartition

__all__ = [
    "Broadcast",
    "ByteBudget",
    "Consumer",
    "ConsumerError",
    "ConsumerSnapshot",
    "FetchedBatch",
    "FlowLimits",
    "LocalFileOffsetStore",
    "Membership",
    "NodeSnapshot",
    "NotAssignedError",
    "OffsetStore",
    "OwnedPartition",
    "PartitionSnapshot",
    "ProcessQueue",
    "RebalanceListener",
    "RebalanceService",
    "Source",
    "StartPosition",
    "StartPositionHook",
    "SubscriptionState",
    "TopicPartition",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "allocate_consistent_hash",
    "allocate_group",
    "allocate_sticky",
    "consumer_status_json",
    "get_strategy",
    "make_consistent_hash",
    "register_strategy",
    "strategy_names",
]
