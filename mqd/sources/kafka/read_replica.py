"""KIP-392 follower fetching: which replica a partition is read from, and for how long.

With ``consumer.kafka.client_rack`` set, every Fetch carries it as ``rack_id`` (v11+); a leader
whose ``replica.selector.class`` picks another replica for that rack answers the partition with no
records and that replica's id (``preferred_read_replica``). The engine already moves a partition to
a node its answer suggests; this keeps what Kafka's Java consumer keeps per partition
(``SubscriptionState.preferredReadReplica`` and its expiry), so that reads go back to the leader:

- when the lease ends: a named replica is leased for ``metadata_refresh_interval`` (the Java
  client's ``metadata.max.age.ms``), and a replica's answers do not renew it (only a leader names
  one). The first answer from the replica after the lease suggests the leader; the leader names the
  replica again if its selector still picks it, so a healthy lease costs one empty leader round trip
  per interval, and a replica the selector stopped picking (rack changed, out of sync) is left;
- when the replica answers a partition error (the caller answers NOT_SERVED, and the engine routes to
  the leader) or OFFSET_OUT_OF_RANGE (its log may end before or start after the leader's: the Java
  consumer asks the leader instead of resetting, and so does mqd);
- when the named replica is not a live broker of our metadata (Java's ``nodeIfOnline``: it may be
  fenced, or our metadata stale): the name is ignored and the leader keeps serving;
- when the partition is read from a replica without a lease at all (the engine fell back to one
  while its leader was unreachable): the leader is suggested at once, as a Java consumer, which
  always reads from the leader without a preferred replica.

A broker without a replica selector (Kafka's default) never names one: then nothing here is used
but the last rule. Per answer and partition, never per record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import structlog

from mqd.topic_partition import TopicPartition

log = structlog.get_logger("mqd.sources.kafka")


class ReadReplicas:
    """The preferred read replica leased per partition (KIP-392)."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._leases: dict[TopicPartition, tuple[str, float]] = {}  # tp -> (replica node, lease end)
        self.named_count = 0  # leader answers naming a live replica (leases given or renewed)
        self.ended = 0  # leases ended by an error or an out-of-range answer of the replica

    def replica(self, tp: TopicPartition) -> str | None:
        """The replica ``tp`` is leased to right now (None: read from the leader)."""
        lease = self._leases.get(tp)
        return lease[0] if lease is not None and self._clock() < lease[1] else None

    def named(self, tp: TopicPartition, replica: str, leader: str, live: Collection[str]) -> str | None:
        """Leader ``leader`` named ``replica`` for ``tp``: the node to read from next, or None (stay)."""
        if replica not in live:
            # fenced, or our metadata has not seen it yet: the leader's own view may lag ours
            self._leases.pop(tp, None)
            return None
        before = self._leases.get(tp)
        self._leases[tp] = (replica, self._clock() + self.lease_s)
        self.named_count += 1
        if before is None or before[0] != replica:
            log.info(
                "kafka preferred read replica",
                topic=tp.topic,
                partition=tp.partition,
                leader=leader,
                replica=replica,
                lease_s=self.lease_s,
            )
        return replica

    def answered(self, tp: TopicPartition, node: str, leader: str) -> str | None:
        """An answer without error from ``node``, a replica that is not ``tp``'s leader: the leader to
        go back to (the lease is over, or there is none), or None (the lease holds)."""
        lease = self._leases.get(tp)
        if lease is not None and lease[0] == node and self._clock() < lease[1]:
            return None
        return leader

    def failed(self, tp: TopicPartition, node: str, leader: str, why: str) -> None:
        """Replica ``node`` answered ``tp`` with ``why``: its lease ends now."""
        lease = self._leases.get(tp)
        if lease is None or lease[0] != node:
            return  # not the leased replica (the engine fell back to it): nothing to end
        del self._leases[tp]
        self.ended += 1
        log.warning(
            "kafka preferred read replica failed; reading from the leader",
            topic=tp.topic,
            partition=tp.partition,
            replica=node,
            leader=leader,
            error=why,
        )

    def forget(self, keep: Collection[TopicPartition]) -> None:
        """Drop the leases of partitions no longer in the metadata (deleted topics)."""
        for tp in [tp for tp in self._leases if tp not in keep]:
            del self._leases[tp]
