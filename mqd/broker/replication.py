"""Slave side of replication: copy the broker group master's partition logs and committed offsets.

One long-poll loop asks the master's ``POST /v1/replica/fetch`` for every partition of the broker group at
once, each at this node's log end (which also tells the master how far this slave has come, for
``acks=all``), and appends what comes back verbatim (offsets preserved) after a full batch check,
so a corrupt answer never reaches the slave's log. A second loop pulls ``GET /v1/replica/offsets``
every second into the ConsumerGroupStore.

Every call is signed and every answer checked (:mod:`mqd.broker.replica_client`): nothing is
applied unless the real master (it knows its secret) answered this very request.

Divergence is told by content first: the master's incarnation history (in every replica answer)
and ours agree up to the newest incarnation both know (replica_divergence.py); past that point the
master holds other records, so this slave truncates there and adopts the master's history. Logs
that never shared one (a new or upgraded pair) fall back to offsets: when the master's log
end is below ours, or the batch it returns for our log end starts before it, this slave truncates
back and copies again. Either way never below its floor (:mod:`mqd.broker.replica_floor`:
what it reported to its master, so what acks=all may have acknowledged). A master that comes back
shorter copies the records back from its slaves before it takes writes (master_recovery.py); if it
still asks for a cut below the floor, the slave parks the partition (error in /v1/stats, degraded
health, a counter) instead of deleting. A range of our own log fenced at open (damaged bytes) is
asked of the master between fetch rounds and repaired in place (fenced_repair.py).

Both loops run supervised: a loop that ends while the replicator is not stopping (an exception
nobody expected, a stray cancellation) is logged as an error with its cause, counted
(``loop_restarts`` in /v1/stats) and started again after a backoff, so replication never stops
without a word (make chaos seed 529091: an answer with a corrupted signature header raised a
``UnicodeEncodeError`` that ended the fetch loop silently, and the slave fell behind for good).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from mqd.backoff import Backoff
from mqd.broker.consumer_groups import ConsumerGroupError, ConsumerGroupStore
from mqd.broker.fenced_repair import repair_from
from mqd.broker.replica_client import ReplicaClient, ReplicaPeerError
from mqd.broker.replica_divergence import agreed_end
from mqd.broker.replica_floor import ReplicaFloor
from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.config import BrokerGroupSpec, MiB
from mqd.errors import MqdError
from mqd.wire import format as fmt
from mqd.wire.client import BrokerError
from mqd.wire.incarnation import IncarnationEntry
from mqd.wire.protocol import FetchAnswer, PartitionFetch, ProtocolError, Status

log = structlog.get_logger(__name__)


class ReplicationError(MqdError):
    """One partition's answer from the master cannot be applied (the partition is retried later)."""

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message, retriable=retriable)


@dataclass(slots=True)
class _ReplicaPartition:
    master_min_offset: int | None = None
    master_max_offset: int | None = None
    error: str | None = None
    retry_at: float = 0.0  # monotonic; the partition is left out of requests until then
    backoff: Backoff | None = None
    parked: bool = False  # following the master would cut below the floor: refused
    repair_at: float = 0.0  # monotonic; when to ask the master for our fenced ranges again
    unrepaired: list[tuple[int, int]] | None = None  # fenced ranges last reported as not repaired


PARKED_RETRY_S = 5.0  # a parked partition asks again this often (the master may have recovered)
REPAIR_RETRY_S = 10.0  # a fenced range the master could not give asks again this often


class FloorRefusal(ReplicationError):
    """Following the master would truncate below what this slave reported (may be acknowledged)."""


class Replicator:
    """Slave side: long-polls its master's /v1/replica/fetch for all of its broker group's partitions,
    appends verbatim, pulls committed offsets (GET /v1/replica/offsets) every second."""

    def __init__(
        self,
        *,
        node_id: str,
        broker_group: BrokerGroupSpec,
        storage: Storage,
        partitions: list[tuple[str, int]],
        client: ReplicaClient,
        consumer_groups: ConsumerGroupStore,
        floor: ReplicaFloor,
        on_append: Callable[[str, int], None],
        wait_ms: int,
        max_bytes: int = 32 * MiB,
        partition_max_bytes: int = 8 * MiB,
        offsets_interval_s: float = 1.0,
        backoff_s: float = 0.1,
        backoff_max_s: float = 2.0,
    ) -> None:
        self.node_id = node_id
        self.broker_group = broker_group
        self.master = broker_group.master
        self._storage = storage
        self._partitions = list(partitions)
        self._client = client
        self._consumer_groups = consumer_groups
        self._floor = floor
        self.truncations_refused = 0  # partitions parked by the floor, counted per refusal
        self.unverified_answers = 0  # answers refused because the master did not sign them
        self.fenced_repaired = 0  # offsets of our fenced ranges repaired from the master
        self.loop_restarts = 0  # replication loops that ended unexpectedly and were started again
        self._unverified: str | None = None  # the last answer came from a node without the master's secret
        self._on_append = on_append
        self._wait_ms = wait_ms
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._offsets_interval_s = offsets_interval_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._states = {key: _ReplicaPartition() for key in self._partitions}
        self._rotation = 0
        self._master_reachable = False
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._offsets_synced_at: float | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restart_backoff: dict[str, Backoff] = {}
        self._started = False
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started or self._stopped:
            return
        self._started = True
        self._spawn("fetch", self._fetch_loop)
        self._spawn("offsets", self._offsets_loop)
        log.info(
            "replication started", node=self.node_id, master=self.master.id, partitions=len(self._partitions)
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}
        try:
            self._floor.save(force=True)
        except OSError as exc:
            log.error("cannot save the replica floor", error=str(exc))

    def status(self) -> dict[str, Any]:
        """Per partition lag, whether the master answers, the last error (GET /v1/stats)."""
        parts = []
        for (topic, partition), st in self._states.items():
            plog = self._storage.get(topic, partition)
            end = plog.max_offset if plog is not None else None
            lag = None
            if end is not None and st.master_max_offset is not None:
                lag = max(0, st.master_max_offset - end)
            parts.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "max_offset": end,
                    "master_max_offset": st.master_max_offset,
                    "lag": lag,
                    "floor": self._floor.floor(topic, partition),
                    "parked": st.parked,
                    "error": st.error,
                }
            )
        return {
            "master": self.master.id,
            "master_reachable": self._master_reachable,
            "last_error": self._last_error,
            "last_error_at": self._last_error_at,
            "offsets_synced_at": self._offsets_synced_at,
            "truncations_refused": self.truncations_refused,
            "unverified_answers": self.unverified_answers,
            "fenced_repaired": self.fenced_repaired,
            "loop_restarts": self.loop_restarts,
            "partitions": parts,
        }

    def health_problems(self) -> list[str]:
        """Reasons for a degraded health: parked partitions, a master that could not be verified."""
        out = [
            f"replication of {t}/{p} refused: {st.error}" for (t, p), st in self._states.items() if st.parked
        ]
        if self._unverified is not None:
            out.append(self._unverified)
        return out

    def _record_error(self, message: str) -> None:
        self._last_error = message
        self._last_error_at = time.time()

    # -- supervision -------------------------------------------------------------------------------

    def _spawn(self, name: str, body: Callable[[], Coroutine[Any, Any, None]], delay: float = 0.0) -> None:
        """Run the loop ``body`` as a task that is started again whenever it ends before stop()."""
        task = asyncio.create_task(self._run_after(delay, body), name=f"replica-{name}-{self.master.id}")
        task.add_done_callback(lambda t: self._loop_ended(name, body, t))
        self._tasks[name] = task

    @staticmethod
    async def _run_after(delay: float, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        await body()

    def _loop_ended(
        self, name: str, body: Callable[[], Coroutine[Any, Any, None]], task: asyncio.Task[None]
    ) -> None:
        if self._stopped:
            return
        # the loops never return: whatever ended this one is a bug, said once per restart
        exc = None if task.cancelled() else task.exception()
        why = "cancelled" if exc is None else f"{type(exc).__name__}: {exc}"
        self.loop_restarts += 1
        backoff = self._restart_backoff.setdefault(name, Backoff(self._backoff_s, self._backoff_max_s))
        delay = backoff.next()
        log.error(
            "replication loop ended unexpectedly: starting it again",
            loop=name,
            master=self.master.id,
            error=why,
            restarts=self.loop_restarts,
            retry_s=round(delay, 3),
            exc_info=exc,
        )
        self._record_error(f"replication {name} loop ended: {why}")
        if name == "fetch":
            self._master_reachable = False  # the next answer says "replicating from master" again
        self._spawn(name, body, delay)

    # -- log replication -------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            request = self._fetch_request(now)
            if not request:
                # every partition is backing off (or there are none): wait for the first to be due
                due = min((st.retry_at for st in self._states.values()), default=now + 1.0)
                await asyncio.sleep(max(0.01, due - now))
                continue
            try:
                answer = await self._client.fetch(
                    self.master, request, max_wait_ms=self._wait_ms, min_bytes=1, max_bytes=self._max_bytes
                )
            except ReplicaPeerError as exc:
                # something answers at the master's address without its secret: apply nothing
                self.unverified_answers += 1
                self._unverified = f"unverified master: {exc}"
                if self._master_reachable or backoff.failures == 0:
                    log.error("master answer not verified: ignored", master=self.master.id, error=str(exc))
                self._master_reachable = False
                self._record_error(f"unverified master: {exc}")
                await asyncio.sleep(backoff.next())
                continue
            except (BrokerError, ProtocolError) as exc:
                if self._master_reachable or backoff.failures == 0:
                    log.warning("master unreachable for replication", master=self.master.id, error=str(exc))
                self._master_reachable = False
                self._record_error(str(exc))
                await asyncio.sleep(backoff.next())
                continue
            if not self._master_reachable:
                log.info("replicating from master", master=self.master.id)
            self._master_reachable = True
            self._unverified = None  # the real master answered
            backoff.reset()
            # the master answered (signed) a request reporting these ends: they may be acknowledged
            reported = {(r["topic"], r["partition"]): int(r["offset"]) for r in request}
            self._apply(answer, loop.time(), reported)
            try:
                self._floor.save()
            except OSError as exc:
                log.error("cannot save the replica floor", error=str(exc))
            await self._repair_fenced(loop.time())

    async def _repair_fenced(self, now: float) -> None:
        """Ask the master for our fenced ranges (damage found at open): what it holds whole replaces
        the hole (fenced_repair.py). Replication past the hole goes on meanwhile: this runs between
        two fetch rounds. A range the master lacks too stays fenced and is asked for again later.
        The range fetch names an offset below our log end, which the master takes as our progress
        until our next fetch (acks=all waits a moment longer, never less)."""
        for (topic, partition), st in self._states.items():
            plog = self._storage.get(topic, partition)
            if plog is None or st.parked or st.repair_at > now or not plog.fenced_ranges():
                continue
            repaired, problems = await repair_from(self._client, self.master, plog)
            self.fenced_repaired += sum(last - first + 1 for first, last in repaired)
            for problem in problems:
                self._record_error(problem)
            left = plog.fenced_ranges()
            if left:
                st.repair_at = now + REPAIR_RETRY_S
                if left != st.unrepaired:  # logged once per change, not every retry
                    log.warning(
                        "fenced ranges not repaired from the master yet",
                        topic=topic,
                        partition=partition,
                        fenced=left,
                        retry_s=REPAIR_RETRY_S,
                    )
            st.unrepaired = left or None

    def _fetch_request(self, now: float) -> list[dict[str, Any]]:
        # start at a different partition each round: the answer's byte budget goes to the first
        # ones, so a fixed order would let a busy early partition starve the later ones
        keys = list(self._states)
        if keys:
            self._rotation = (self._rotation + 1) % len(keys)
            keys = keys[self._rotation :] + keys[: self._rotation]
        out = []
        for topic, partition in keys:
            st = self._states[(topic, partition)]
            plog = self._storage.get(topic, partition)
            if plog is None or st.retry_at > now:
                continue
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": plog.max_offset,
                    "max_bytes": self._partition_max_bytes,
                }
            )
        return out

    def _apply(
        self, answer: FetchAnswer, now: float, reported: dict[tuple[str, int], int] | None = None
    ) -> None:
        for (topic, partition), offset in (reported or {}).items():
            self._floor.raise_to(topic, partition, offset)
        for p in answer.partitions:
            key = (p.topic, p.partition)
            st = self._states.get(key)
            if st is None:
                continue  # not asked for: ignore
            try:
                appended = self._apply_partition(p, st)
            except FloorRefusal as exc:
                message = f"{p.topic}/{p.partition}: {exc}"
                if not st.parked:
                    self.truncations_refused += 1
                    log.error(
                        "replication parked: the master would cut acknowledged records",
                        topic=p.topic,
                        partition=p.partition,
                        error=str(exc),
                    )
                st.parked = True
                st.error = message
                self._record_error(message)
                st.retry_at = now + PARKED_RETRY_S
                continue
            except (ReplicationError, StorageError, fmt.BatchError) as exc:
                message = f"{p.topic}/{p.partition}: {exc}"
                if st.error != message:
                    log.error(
                        "replication failed for partition",
                        topic=p.topic,
                        partition=p.partition,
                        error=str(exc),
                    )
                st.error = message
                self._record_error(message)
                st.backoff = st.backoff or Backoff(self._backoff_s, self._backoff_max_s)
                st.retry_at = now + st.backoff.next()
                continue
            if st.error is not None:
                log.info("replication recovered for partition", topic=p.topic, partition=p.partition)
            st.parked = False
            st.error = None
            st.backoff = None
            st.retry_at = 0.0
            if appended:
                self._on_append(p.topic, p.partition)

    def _apply_partition(self, p: PartitionFetch, st: _ReplicaPartition) -> bool:
        """Apply one partition's answer; True when records were appended."""
        plog = self._storage.get(p.topic, p.partition)
        if plog is None:
            raise ReplicationError("partition is not open on this node", retriable=False)
        if p.status is Status.NOT_SERVED:
            raise ReplicationError(f"master does not serve it: {p.error}")
        st.master_min_offset, st.master_max_offset = p.min_offset, p.max_offset
        history = p.history  # the master's incarnation history (replica answers carry it)
        if p.status is Status.OFFSET_TOO_SMALL:
            # the master's retention passed our log end: our log cannot continue, restart at its start
            log.warning(
                "replica log behind the master's log start: restarting it",
                topic=p.topic,
                partition=p.partition,
                log_end=plog.max_offset,
                master_min_offset=p.min_offset,
            )
            plog.truncate_fully_and_start_at(p.min_offset, history)
            self._floor.reset(p.topic, p.partition, p.min_offset)
            return False
        floor = self._floor.floor(p.topic, p.partition)
        agreed = None if history is None else agreed_end(plog.history, plog.max_offset, history, p.max_offset)
        if agreed is None and history is not None and self._floor.synced(p.topic, p.partition):
            agreed = 0  # we took a master history before and share none with this one: other records
        if agreed is not None:
            # by content: past the newest incarnation both know, the master holds other records
            if agreed < plog.max_offset:
                self._cut(plog, agreed, floor, "diverged from the master's incarnation history", history)
                return False
        elif p.max_offset < plog.max_offset:
            # no shared history (a new or upgraded pair): offsets decide, as before incarnations
            self._cut(plog, p.max_offset, floor, "ahead of the master's log end", history)
            return False
        if history is not None:
            if plog.history != history:
                plog.adopt_history(history)  # our records are the master's: take its names for them
            self._floor.mark_synced(p.topic, p.partition)
        if p.status is Status.DATA_LOST:
            self._copy_hole(plog, p)
            return False
        if p.status is not Status.FOUND or len(p.data) == 0:
            return False
        data = bytes(p.data)
        infos = fmt.validate(data)  # header, CRC and layout of every batch, before any write
        first = infos[0].base_offset
        if first < plog.max_offset:
            # our log end falls inside a master batch: the logs diverged there
            self._cut(plog, first, floor, "inside a master batch", history)
            if plog.max_offset != first:
                return False  # our batches are cut elsewhere: ask again from the new end
        elif first > plog.max_offset:
            raise ReplicationError(f"master answered from offset {first}, log end is {plog.max_offset}")
        plog.append_replica(data, infos)
        return True

    def _copy_hole(self, plog: PartitionLog, p: PartitionFetch) -> None:
        """The master cannot serve offsets ``lost_first..lost_last`` (a fenced range no replica
        repaired): fence the same range here and go on after it. Records of it that this log holds
        are kept (the master repairs its range from them at its next start)."""
        first, last = p.lost_first, p.lost_last
        end = plog.max_offset
        if first is None or last is None or not first <= end <= last:
            raise ReplicationError(f"master answered DATA_LOST {first}..{last} for our log end {end}")
        log.error(
            "master lost a range: fencing it here too",
            topic=plog.topic,
            partition=plog.partition,
            lost_first=first,
            lost_last=last,
            kept_up_to=end,
        )
        plog.append_fenced(end, last)

    def _cut(
        self, plog: PartitionLog, to: int, floor: int, why: str, history: list[IncarnationEntry] | None
    ) -> None:
        """Truncate to follow the master, never below the floor (FloorRefusal instead)."""
        if to < floor:
            raise FloorRefusal(
                f"following master {self.master.id} would cut to offset {to} ({why}), below offset "
                f"{floor} this slave reported (possibly acknowledged with acks=all); not truncating"
            )
        log.warning(
            "replica log truncated to follow the master",
            topic=plog.topic,
            partition=plog.partition,
            log_end=plog.max_offset,
            to=to,
            why=why,
        )
        plog.truncate_to(to, history)

    # -- committed offsets -------------------------------------------------------------------------

    async def _offsets_loop(self) -> None:
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        last: dict[str, list[dict[str, Any]]] | None = None
        while True:
            try:
                snapshot = await self._client.offsets(self.master)
                if snapshot != last:
                    self._consumer_groups.merge_offsets(snapshot)
                    last = snapshot
                self._offsets_synced_at = time.time()
                backoff.reset()
                delay = self._offsets_interval_s
            except ReplicaPeerError as exc:
                if self._unverified is None:
                    log.error("master answer not verified: ignored", master=self.master.id, error=str(exc))
                self.unverified_answers += 1
                self._unverified = f"unverified master: {exc}"
                self._record_error(f"committed offsets: {exc}")
                delay = backoff.next()
            except (BrokerError, ConsumerGroupError) as exc:
                self._record_error(f"committed offsets: {exc}")
                delay = backoff.next()
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.error("malformed committed offsets from master", master=self.master.id, error=str(exc))
                self._record_error(f"committed offsets: malformed answer: {exc}")
                delay = backoff.next()
            await asyncio.sleep(delay)
