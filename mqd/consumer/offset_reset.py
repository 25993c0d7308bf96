"""What to do when a fetch position is illegal (``on_offset_reset``: broker | earliest | latest | fail).

An illegal position is one the source answered OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY or
NO_MESSAGE for. :func:`decide` is the policy as a pure function; :class:`OffsetReset` applies it to
an owned partition (log line, metric, position or park, and the offset lookup for earliest/latest,
which must not move a partition that was revoked or sought meanwhile).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from mqd import metrics
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import FetchStatus, PartitionResult
from mqd.consumer.subscription_state import OwnedPartition, SubscriptionState
from mqd.topic_partition import TopicPartition

log = structlog.get_logger("mqd.consumer.fetcher")

POLICIES = ("broker", "earliest", "latest", "fail")


class Action(enum.Enum):
    MOVE = "move"  # to the offset the source suggests
    PARK = "park"  # stop fetching the partition, with a reason
    LOOKUP = "lookup"  # look up the earliest or latest offset, then move there


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    to_offset: int | None = None  # MOVE
    reason: str | None = None  # PARK
    spec: str | None = None  # LOOKUP: "earliest" | "latest"


def decide(
    policy: str, status: FetchStatus, offset: int, next_offset: int, log_start: int, log_end: int
) -> Decision:
    """The decision for a fetch at ``offset`` answered ``status`` (an illegal-offset status)."""
    if policy == "broker":
        return Decision(Action.MOVE, to_offset=next_offset)
    if policy == "fail":
        where = f"log {log_start}..{log_end}"
        return Decision(
            Action.PARK, reason=f"{status.value} at offset {offset} ({where}); on_offset_reset = fail"
        )
    if policy in ("earliest", "latest"):
        return Decision(Action.LOOKUP, spec=policy)
    raise ValueError(f"unknown on_offset_reset policy {policy!r}")


class OffsetReset:
    """Applies the policy; the fetcher calls :meth:`illegal_offset` from its answer callback."""

    def __init__(
        self,
        state: SubscriptionState,
        *,
        lookup: Callable[[list[TopicPartition], str], Awaitable[dict[TopicPartition, int]]],
        on_error: Callable[[OwnedPartition, str], None],
        wake: Callable[[str | None], None],
        spawn: Callable[[Awaitable[None]], None],
        clock: Callable[[], float],
    ) -> None:
        self._state = state
        self._lookup = lookup
        self._on_error = on_error
        self._wake = wake
        self._spawn = spawn
        self._clock = clock
        self.resets = 0

    def illegal_offset(self, op: OwnedPartition, offset: int, res: PartitionResult, policy: str) -> None:
        tp = op.tp
        metrics.offset_resets.labels(tp.topic, str(tp.partition), res.status.value).inc()
        self.resets += 1
        d = decide(policy, res.status, offset, res.next_offset, res.log_start, res.log_end)
        fields = {
            "topic": tp.topic,
            "partition": tp.partition,
            "status": res.status.value,
            "from_offset": offset,
            "policy": policy,
        }
        if d.action is Action.MOVE:
            assert d.to_offset is not None
            log.warning(
                "offset moved by broker",
                **fields,
                to_offset=d.to_offset,
                log_start=res.log_start,
                log_end=res.log_end,
            )
            op.position = d.to_offset
        elif d.action is Action.PARK:
            op.parked = op.last_error = d.reason
            log.error(
                "illegal offset, partition parked",
                **fields,
                to_offset=None,
                log_start=res.log_start,
                log_end=res.log_end,
            )
        else:
            assert d.spec is not None
            op.resetting = True
            self._spawn(self._reset(op, op.epoch, offset, d.spec, res.status))

    async def _reset(
        self, op: OwnedPartition, epoch: int, offset: int, policy: str, status: FetchStatus
    ) -> None:
        tp = op.tp
        try:
            found = await self._lookup([tp], policy)
            target = found[tp]
        except (ConsumerError, KeyError) as exc:
            op.resetting = False
            self._on_error(op, f"offset reset ({policy}) failed: {exc}")
            log.warning(
                "offset reset lookup failed",
                topic=tp.topic,
                partition=tp.partition,
                policy=policy,
                error=str(exc),
            )
            asyncio.get_running_loop().call_later(op.retry_at - self._clock(), self._wake, op.pull_node)
            return
        op.resetting = False
        if not self._state.is_current(op, epoch):
            return  # revoked or sought meanwhile: the newer decision stands
        log.warning(
            "offset reset",
            topic=tp.topic,
            partition=tp.partition,
            status=status.value,
            from_offset=offset,
            to_offset=target,
            policy=policy,
        )
        op.position = target
        self._wake(op.pull_node)
