"""A master gets back from its slaves what its own log lacks, before it takes writes (issue 12.2).

A master that restarts with a shorter log than a slave's (an unclean stop lost its unsynced tail, or
its data dir was replaced) would otherwise take new writes at offsets its slaves already hold with
other, acknowledged records. So at start, before it listens, a master with slaves asks each one
(signed replica fetches, :mod:`mqd.broker.replica_client`) for its log from the master's log end, and
copies back, verbatim and batch-checked, whatever the longest slave has beyond it, under the
slave's incarnation history (the records keep the names consumers saw them under). Our log must
agree with the slave's up to our end (replica_divergence.py); when it holds other records past the
agreed point it is left as it is and the partition is reported.

Whether the master may take writes without having consulted a slave depends on the node marker
(:mod:`mqd.broker.node_marker`): with a marker the data dir is the node's own, so after a bounded wait
(:data:`START_CONSULT_S`) it serves as before; without one (new or replaced dir) it refuses writes and
replica fetches with 503 ``data_dir_unverified`` and keeps consulting in the background until a slave
answers (then it writes the marker), or an operator runs ``mqd broker-init`` for the node (which
writes the marker; this loop sees it within a second).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog

from mqd import format as fmt
from mqd.backoff import Backoff
from mqd.broker.fenced_repair import COPY_MAX_BYTES, repair_from
from mqd.broker.incarnation import IncarnationEntry
from mqd.broker.node_marker import read_marker, write_marker
from mqd.broker.replica_client import ReplicaClient, ReplicaPeerError
from mqd.broker.replica_divergence import agreed_end
from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.client import BrokerError
from mqd.config import NodeSpec
from mqd.errors import MqdError
from mqd.protocol import FetchAnswer, ProtocolError, Status

log = structlog.get_logger(__name__)

START_CONSULT_S = 2.0  # before listening, wait at most this long for a slave to answer
PROBE_TIMEOUT_S = 1.0  # one round of asking the slaves for their log ends
RETRY_MAX_S = 2.0


_SlaveLog = tuple[int, int, list[IncarnationEntry] | None]  # a slave's min, max offset and history


class RecoveryError(MqdError):
    """A partition whose slave copy cannot be appended (divergent batches): reported, not applied."""


@dataclass(slots=True)
class RecoveryResult:
    consulted: list[str] = field(default_factory=list)  # slaves that answered
    copied: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> records copied back
    problems: list[str] = field(default_factory=list)


class MasterRecovery:
    """Consults the slaves of a master and copies back what its log lacks; gates writes until then."""

    def __init__(
        self,
        *,
        node_id: str,
        cluster_id: str | None,
        storage: Storage,
        partitions: list[tuple[str, int]],
        slaves: list[NodeSpec],
        client: ReplicaClient,
    ) -> None:
        self.node_id = node_id
        self._cluster_id = cluster_id
        self._storage = storage
        self._partitions = list(partitions)
        self._slaves = list(slaves)
        self._client = client
        self._data_dir = storage.data_dir
        # why writes are refused right now (None: open); read by the produce and replica handlers
        self.writes_refused: str | None = None
        self.result: RecoveryResult | None = None
        self._task: asyncio.Task[None] | None = None

    def _marked(self) -> bool:
        return read_marker(self._data_dir) is not None

    async def start(self) -> None:
        """Consult the slaves once (bounded); with no marker and no slave answering, refuse writes
        and keep trying in the background."""
        marked = self._marked()
        if not marked:
            self.writes_refused = (
                f"master {self.node_id} has a new or replaced data dir and has not yet consulted its "
                f"slaves ({', '.join(s.id for s in self._slaves)}): writes are refused until one answers "
                f"or an operator runs `mqd broker-init --config <node file>`"
            )
            log.warning(
                "data dir without node marker: consulting slaves before taking writes", node=self.node_id
            )
        else:
            self.writes_refused = f"master {self.node_id} is consulting its slaves before taking writes"
        deadline = time.monotonic() + START_CONSULT_S
        backoff = Backoff(0.1, 0.5)
        while True:
            if await self._attempt(min(PROBE_TIMEOUT_S, max(0.1, deadline - time.monotonic()))):
                return
            delay = backoff.next()
            if time.monotonic() + delay >= deadline:
                break
            await asyncio.sleep(delay)
        if marked:
            log.warning(
                "no slave answered: taking writes with the log as it is",
                node=self.node_id,
                waited_s=START_CONSULT_S,
            )
            self.writes_refused = None
            return
        self._task = asyncio.create_task(self._retry_loop(), name="master-recovery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _retry_loop(self) -> None:
        backoff = Backoff(0.2, RETRY_MAX_S)
        while True:
            await asyncio.sleep(backoff.next())
            if self._marked():
                log.warning(
                    "operator accepted the data dir (node marker written): taking writes", node=self.node_id
                )
                self.writes_refused = None
                return
            try:
                if await self._attempt():
                    return
            except Exception:
                log.exception("master recovery attempt failed", node=self.node_id)

    async def _attempt(self, probe_timeout: float = PROBE_TIMEOUT_S) -> bool:
        """One round: True when a slave answered and everything it had beyond our log was copied."""
        ends = await self._slave_ends(probe_timeout)
        if not ends:
            return False
        result = RecoveryResult(consulted=sorted(ends))
        for topic, partition in self._partitions:
            plog = self._storage.get(topic, partition)
            if plog is None:
                continue
            key = (topic, partition)
            have = [(sid, e[key]) for sid, e in ends.items() if key in e]
            if not have:
                continue
            slave_id, (slave_min, slave_max, slave_history) = max(have, key=lambda kv: kv[1][1])
            if slave_max <= plog.max_offset:
                continue
            spec = next(s for s in self._slaves if s.id == slave_id)
            prepared = False
            try:
                self._prepare(plog, slave_min, slave_max, slave_history)
                prepared = True
                copied = await self._copy(spec, topic, partition, slave_max)
            except (RecoveryError, StorageError, fmt.BatchError, BrokerError, ProtocolError) as exc:
                if prepared:
                    self._new_incarnation(plog, "copy-back from a slave stopped before its log end")
                problem = f"{topic}/{partition}: cannot copy back from {slave_id}: {exc}"
                log.error("master recovery: partition not recovered", node=self.node_id, problem=problem)
                result.problems.append(problem)
                if isinstance(exc, BrokerError):
                    return False  # the slave went away mid-copy: try the whole round again
                continue
            self._new_incarnation(plog, "records taken back from a slave")
            result.copied[f"{topic}/{partition}"] = copied
            log.warning(
                "master recovered records from a slave",
                node=self.node_id,
                slave=slave_id,
                topic=topic,
                partition=partition,
                records=copied,
                log_end=plog.max_offset,
                incarnation=plog.incarnation,
            )
        for slave_id in result.consulted:
            await self._repair_fenced(next(s for s in self._slaves if s.id == slave_id), result)
        self.result = result
        if not self._marked():
            write_marker(self._data_dir, self.node_id, self._cluster_id, "recovered")
        self.writes_refused = None
        log.info(
            "master consulted its slaves",
            node=self.node_id,
            slaves=result.consulted,
            copied=sum(result.copied.values()),
            problems=len(result.problems),
        )
        return True

    async def _slave_ends(self, timeout: float) -> dict[str, dict[tuple[str, int], _SlaveLog]]:
        """Each answering slave's (min, max, history) per partition, from one signed replica fetch."""
        request = [
            {"topic": t, "partition": p, "offset": plog.max_offset, "max_bytes": 1}
            for t, p in self._partitions
            if (plog := self._storage.get(t, p)) is not None
        ]
        answers = await asyncio.gather(
            *(
                self._client.fetch(s, request, max_wait_ms=0, max_bytes=1, min_bytes=0, timeout=timeout)
                for s in self._slaves
            ),
            return_exceptions=True,
        )
        out: dict[str, dict[tuple[str, int], _SlaveLog]] = {}
        for slave, answer in zip(self._slaves, answers, strict=True):
            if isinstance(answer, ReplicaPeerError):
                log.error(
                    "slave answer not verified: ignored", node=self.node_id, slave=slave.id, error=str(answer)
                )
                continue
            if isinstance(answer, BrokerError | ProtocolError):
                log.debug("slave not reachable for recovery", slave=slave.id, error=str(answer))
                continue
            if isinstance(answer, BaseException):
                raise answer
            out[slave.id] = {
                (p.topic, p.partition): (p.min_offset, p.max_offset, p.history)
                for p in answer.partitions
                if p.status is not Status.NOT_SERVED
            }
        return out

    def _new_incarnation(self, plog: PartitionLog, why: str) -> None:
        """After a copy-back our log carries the slave's incarnation ids, but ends where the slave's
        copy (or a failed copy) ended: the lost log may have served further under the same id (an
        unreplicated tail, a damaged batch the copy stopped at). The offsets we write next get a new
        id, so a consumer past our end sees INCARNATION_CHANGED instead of reused offsets under
        the id it landed them with (issue 12: records cut as already landed)."""
        try:
            plog.begin_incarnation(why)
        except StorageError as exc:
            log.error("master recovery: no new incarnation", node=self.node_id, error=str(exc))

    def _prepare(
        self, plog: PartitionLog, slave_min: int, slave_max: int, history: list[IncarnationEntry] | None
    ) -> None:
        """Make our log ready to continue with the slave's records: an empty log takes the slave's
        start and history; one sharing the slave's history up to our end takes its history (our
        newest incarnation wrote nothing the slave lacks); otherwise refuse (RecoveryError)."""
        if plog.max_offset == plog.min_offset:  # empty: a new data dir, or everything lost
            if history is None:
                if slave_min != plog.max_offset:
                    plog.truncate_fully_and_start_at(slave_min)
            elif slave_min != plog.max_offset:
                plog.truncate_fully_and_start_at(slave_min, history)
            else:
                plog.adopt_history(history)
            return
        if plog.max_offset < slave_min:
            raise RecoveryError(
                f"our log ends at {plog.max_offset}, the slave's starts at {slave_min} (a gap)"
            )
        if history is None:
            return  # a slave without histories: offsets decide (batch boundaries checked on append)
        agreed = agreed_end(plog.history, plog.max_offset, history, slave_max)
        if agreed is None:
            return  # never shared a history (logs upgraded separately): offsets decide, as before
        if agreed < plog.max_offset:
            raise RecoveryError(
                f"our log holds other records than the slave's from offset {agreed} (incarnation "
                f"{plog.incarnation}): left as it is"
            )
        plog.adopt_history(history)

    async def _repair_fenced(self, slave: NodeSpec, result: RecoveryResult) -> None:
        """Ask ``slave`` for the batches of every fenced range of ours (damaged bytes found at
        open): where it holds them whole, with the same boundaries, they replace the hole."""
        for topic, partition in self._partitions:
            plog = self._storage.get(topic, partition)
            if plog is None:
                continue
            repaired, problems = await repair_from(self._client, slave, plog)
            result.problems.extend(problems)
            if repaired:
                key = f"{topic}/{partition}"
                result.copied[key] = result.copied.get(key, 0) + sum(b - a + 1 for a, b in repaired)

    async def _copy(self, slave: NodeSpec, topic: str, partition: int, slave_max: int) -> int:
        plog = self._storage.get(topic, partition)
        assert plog is not None
        start = plog.max_offset
        while plog.max_offset < slave_max:
            answer: FetchAnswer = await self._client.fetch(
                slave,
                [
                    {
                        "topic": topic,
                        "partition": partition,
                        "offset": plog.max_offset,
                        "max_bytes": COPY_MAX_BYTES,
                    }
                ],
                max_wait_ms=0,
                max_bytes=COPY_MAX_BYTES,
            )
            p = answer.partitions[0]
            if p.status is not Status.FOUND or len(p.data) == 0:
                raise RecoveryError(f"slave answered {p.status} at offset {plog.max_offset}")
            data = bytes(p.data)
            infos = fmt.validate(data)
            if infos[0].base_offset != plog.max_offset:
                raise RecoveryError(
                    f"slave batch starts at {infos[0].base_offset}, our log ends at {plog.max_offset} "
                    f"(the logs diverged)"
                )
            plog.append_replica(data, infos)
        return plog.max_offset - start
