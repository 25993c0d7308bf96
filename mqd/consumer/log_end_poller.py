"""The log-end poller: true lag for every owned partition, and the "stuck" verdict.

A partition's log end otherwise moves only when a fetch answer arrives, so a paused, parked, failing
or held-back partition would look caught up. Like ``kafka-consumer-groups --describe``, this timer
asks the source for the log end of every owned partition (the Source seam's ``list_offsets(...,
"latest")``: the mqd broker and the Kafka source alike), one request per serving node, whatever the
partition's state, and sets the per-partition gauges (log end, committed, landed, lag, fetch lag,
time lag, freshness).

**Lag** is the log end minus the landed offset (the committed one while nothing is marked), as
``kafka-consumer-groups`` computes it from the committed offset: the daemon commits only what
landed. The log end is what the source answers for "latest": the Kafka source asks under its
isolation level, so under ``read_committed`` it is the last stable offset.

**Time lag** is the age of the oldest record not landed yet, 0 when caught up (an idle topic's time
lag does not grow). The poller keeps, per partition, when it saw the log end move
(:class:`ArrivalClock`): the record at the landed offset entered the log between the last poll that
saw the log end at or below it and the first that saw it above, and its time is interpolated in
between by offset. A backlog already there at the first poll is dated from that poll (a lower
bound). Poll times need no record timestamps, so a producer's clock or event-time stamps in the
past do not count as lag.

**Stuck**: a partition is stuck when nothing more was landed for ``stuck_intervals`` polls in a row
while it is behind and its log end grew meanwhile (:class:`StuckTracker`). A partition with nothing
new to land is idle, not stuck. ``landed`` is the offset the consumer's owner marked handled (the
daemon marks exactly what it published).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from mqd import metrics
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import Source
from mqd.consumer.subscription_state import SubscriptionState
from mqd.topic_partition import TopicPartition
from mqd.waiting import cancel_and_wait

log = structlog.get_logger("mqd.consumer.log_end")


@dataclass(slots=True)
class _Progress:
    landed: int | None
    log_end: int
    stalled: int  # polls in a row without landed progress while behind
    log_end_at_stall: int  # the log end when the stall began


class StuckTracker:
    """Per partition: polls without landed progress while behind, and whether the log end grew."""

    def __init__(self, stuck_intervals: int) -> None:
        self.stuck_intervals = stuck_intervals
        self._progress: dict[TopicPartition, _Progress] = {}

    def observe(self, tp: TopicPartition, landed: int | None, log_end: int) -> bool:
        """Record one poll's figures; True when ``tp`` is stuck now."""
        p = self._progress.get(tp)
        behind = (landed or 0) < log_end  # nothing landed yet: behind once the log holds records
        if p is None or not behind or landed != p.landed:
            self._progress[tp] = _Progress(landed, log_end, 0, log_end)
            return False
        p.stalled += 1
        p.log_end = log_end
        return self.is_stuck(tp)

    def is_stuck(self, tp: TopicPartition) -> bool:
        p = self._progress.get(tp)
        return p is not None and p.stalled >= self.stuck_intervals and p.log_end > p.log_end_at_stall

    def stalled(self, tp: TopicPartition) -> int:
        p = self._progress.get(tp)
        return 0 if p is None else p.stalled

    def forget(self, tp: TopicPartition) -> None:
        self._progress.pop(tp, None)


class ArrivalClock:
    """Per partition: the wall-clock times at which the poller saw the log end move, to date the
    first record not landed yet. A point is ``[log end, first seen ms, last seen ms]``; points are
    in log-end order, the first being the newest one at or below the landed offset."""

    MAX_POINTS = 64  # per partition; past it every other point is dropped (coarser, never wrong)

    def __init__(self) -> None:
        self._points: dict[TopicPartition, list[list[int]]] = {}

    def observe(self, tp: TopicPartition, log_end: int, landed: int | None, now_ms: int) -> int | None:
        """Record one poll's log end; returns when the record at ``landed`` entered the log (ms,
        interpolated between polls), or None when nothing is behind (or ``landed`` is unknown)."""
        points = self._points.setdefault(tp, [])
        while points and points[-1][0] > log_end:
            points.pop()  # a shorter log (replaced, truncated, or a replica behind): forget beyond it
        if points and points[-1][0] == log_end:
            points[-1][2] = now_ms
        else:
            points.append([log_end, now_ms, now_ms])
        if landed is None or landed >= log_end:
            del points[:-1]  # caught up: only the present is a base for what comes next
            return None
        while len(points) > 1 and points[1][0] <= landed:
            del points[0]  # history wholly landed: the next point at or below landed is the base
        if len(points) > self.MAX_POINTS:
            del points[2:-1:2]
        if points[0][0] > landed:
            return points[0][1]  # behind since the first poll we know of
        base, after = points[0], points[1]
        share = (landed - base[0] + 1) / (after[0] - base[0])  # its place among the records added
        return round(base[2] + share * (after[1] - base[2]))

    def forget(self, tp: TopicPartition) -> None:
        self._points.pop(tp, None)


@dataclass(frozen=True, slots=True)
class LagView:
    """What the poller knows of one partition, for the snapshot."""

    landed: int | None
    landed_event_time_ms: int | None  # newest landed record's event time (since start)
    log_end_age_s: float | None  # since the last log-end answer (None: none yet)
    stalled_polls: int
    stuck: bool
    # when the first record not landed yet entered the log (wall-clock ms, see ArrivalClock); None:
    # caught up at the last poll, or no poll yet
    unlanded_since_ms: int | None = None


class LogEndPoller:
    """Asks the source for every owned partition's log end every ``interval`` seconds."""

    def __init__(
        self,
        *,
        source: Source,
        state: SubscriptionState,
        choose_node: Callable[[TopicPartition], str | None],
        committed: Callable[[TopicPartition], int | None],
        landed: Callable[[TopicPartition], int | None],
        interval: float,
        stuck_intervals: int,
        timeout: float,
    ) -> None:
        self.source = source
        self.state = state
        self.choose_node = choose_node
        self.committed = committed
        self.landed = landed
        self.interval = interval
        self.timeout = timeout
        self.stuck = StuckTracker(stuck_intervals)
        self.arrivals = ArrivalClock()
        self._unlanded_since: dict[TopicPartition, int] = {}
        self._polled_at: dict[TopicPartition, float] = {}
        self._event_ms: dict[TopicPartition, int] = {}
        self._labelled: set[TopicPartition] = set()
        self._node_errors: dict[str, str] = {}  # last error per node: logged when it changes
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqd-log-end-poller")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for tp in list(self._labelled):
            self._unlabel(tp)
        metrics.stuck_partitions.set(0)

    def note_landed(self, tp: TopicPartition, event_time_ms: int) -> None:
        """The newest event time of records just landed for ``tp`` (the landing freshness)."""
        if event_time_ms > self._event_ms.get(tp, -1):
            self._event_ms[tp] = event_time_ms

    def view(self, tp: TopicPartition, now: float) -> LagView:
        at = self._polled_at.get(tp)
        return LagView(
            landed=self.landed(tp),
            landed_event_time_ms=self._event_ms.get(tp),
            log_end_age_s=None if at is None else round(now - at, 3),
            stalled_polls=self.stuck.stalled(tp),
            stuck=self.stuck.is_stuck(tp),
            unlanded_since_ms=self._unlanded_since.get(tp),
        )

    async def _run(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # the timer must outlive any one bad poll
                log.exception("log-end poll failed")
            await asyncio.sleep(self.interval)

    async def poll_once(self) -> None:
        """One round: every owned partition's log end, then the gauges and the stuck verdicts."""
        by_node: dict[str, list[TopicPartition]] = {}
        for tp, op in sorted(self.state.partitions.items()):
            node = op.pull_node or self.choose_node(tp)
            if node is not None:
                by_node.setdefault(node, []).append(tp)
        answers = await asyncio.gather(*(self._ask(node, tps) for node, tps in by_node.items()))
        now = time.monotonic()
        for ends in answers:
            for tp, end in ends.items():
                owned = self.state.partitions.get(tp)
                if owned is None:
                    continue  # revoked while we asked
                owned.log_end = end
                self._polled_at[tp] = now
        self._update(now)

    async def _ask(self, node: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        try:
            async with asyncio.timeout(self.timeout):
                ends = await self.source.list_offsets(node, tps, "latest")
        except (ConsumerError, TimeoutError, OSError) as exc:
            metrics.log_end_poll_errors.labels(node).inc()
            text = str(exc) or type(exc).__name__
            if self._node_errors.get(node) != text:
                log.warning("log-end lookup failed", node=node, partitions=len(tps), error=text)
            self._node_errors[node] = text
            return {}
        if self._node_errors.pop(node, None) is not None:
            log.info("log-end lookup answers again", node=node)
        return ends

    def _update(self, now: float) -> None:
        owned = self.state.partitions
        for tp in [tp for tp in self._labelled if tp not in owned]:
            self._unlabel(tp)
        for tp in [tp for tp in self._polled_at if tp not in owned]:
            self._polled_at.pop(tp, None)
            self._event_ms.pop(tp, None)
            self._unlanded_since.pop(tp, None)
            self.stuck.forget(tp)
            self.arrivals.forget(tp)
        wall_ms = time.time() * 1000
        stuck = 0
        labelled = self._labelled
        for tp, op in owned.items():
            labelled.add(tp)
            committed, landed = self.committed(tp), self.landed(tp)
            if committed is not None:
                metrics.committed_offset_of.get(tp).set(committed)
            if landed is not None:
                metrics.landed_offset_of.get(tp).set(landed)
            event_ms = self._event_ms.get(tp)
            if event_ms is not None:
                metrics.landing_freshness_of.get(tp).set(max(0.0, (wall_ms - event_ms) / 1000))
            if op.log_end is None or tp not in self._polled_at:
                continue
            metrics.log_end_offset_of.get(tp).set(op.log_end)
            metrics.consumer_fetch_lag_of.get(tp).set(max(0, op.log_end - op.position))
            done = landed if landed is not None else committed
            since = self.arrivals.observe(tp, op.log_end, done, int(wall_ms))
            if since is None:
                self._unlanded_since.pop(tp, None)
            else:
                self._unlanded_since[tp] = since
            if done is not None:
                metrics.consumer_lag_of.get(tp).set(max(0, op.log_end - done))
                age = 0.0 if since is None else max(0.0, (wall_ms - since) / 1000)
                metrics.consumer_time_lag_of.get(tp).set(age)
            was_stuck = self.stuck.is_stuck(tp)
            if self.stuck.observe(tp, landed, op.log_end):
                stuck += 1
                if not was_stuck:
                    log.error(
                        "partition stuck: nothing landed while its log end grew",
                        topic=tp.topic,
                        partition=tp.partition,
                        landed=landed,
                        log_end=op.log_end,
                        polls=self.stuck.stalled(tp),
                        paused=op.paused,
                        parked=op.parked,
                        last_error=op.last_error,
                    )
            elif was_stuck:
                log.info("partition no longer stuck", topic=tp.topic, partition=tp.partition, landed=landed)
        metrics.stuck_partitions.set(stuck)

    def _unlabel(self, tp: TopicPartition) -> None:
        self._labelled.discard(tp)
        for gauge in (
            metrics.committed_offset_of,
            metrics.landed_offset_of,
            metrics.log_end_offset_of,
            metrics.consumer_lag_of,
            metrics.consumer_fetch_lag_of,
            metrics.consumer_time_lag_of,
            metrics.landing_freshness_of,
        ):
            gauge.remove(tp)
