"""A master gets back from its slaves what its own log lacks, before it takes writes (issue 12.2).

A master that restarts with a shorter log than a slave's (an unclean stop lost its unsynced tail, or
its data dir was replaced) would otherwise take new writes at offsets its slaves already hold with
other, acknowledged records. So at start, before it listens, a master with slaves asks each one
(signed replica fetches, :mod:`mqd.broker.replica_client`) for its log from the master's log end, and
copies back, verbatim and batch-checked, whatever the longest slave has beyond it, under the
slave's incarnation history (the records keep the names consumers saw them under). Our log must
agree with the slave's up to our end (replica_divergence.py); when it holds other records past the
agreed point it is left as it is and the partition is reported.

A batch the slave's copy holds damaged (its CRC fails: damage the slave's trusted index did not
reveal) or has fenced does not end the copy: every intact batch before it is copied, exactly the
damaged range is fenced here (:meth:`PartitionLog.append_fenced`, reported), and the copy goes on
after it. Fenced ranges are then asked of every slave (fenced_repair.py); ranges fenced later, by
the scrub (scrub.py), are asked for again when it fences them (:meth:`MasterRecovery.repair_soon`),
with backoff while some remain.

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

from mqd.backoff import Backoff
from mqd.broker.fenced_repair import COPY_MAX_BYTES, read_range, repair_from
from mqd.broker.node_marker import read_marker, write_marker
from mqd.broker.replica_client import ReplicaClient, ReplicaPeerError
from mqd.broker.replica_divergence import agreed_end
from mqd.broker.segment import find_intact_batch
from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.config import NodeSpec
from mqd.errors import MqdError
from mqd.wire import format as fmt
from mqd.wire.client import BrokerError
from mqd.wire.incarnation import IncarnationEntry
from mqd.wire.protocol import FetchAnswer, PartitionFetch, ProtocolError, Status

log = structlog.get_logger(__name__)

START_CONSULT_S = 2.0  # before listening, wait at most this long for a slave to answer
PROBE_TIMEOUT_S = 1.0  # one round of asking the slaves for their log ends
RETRY_MAX_S = 2.0
REPAIR_RETRY_BASE_S = 1.0  # fenced ranges no slave could give yet: asked again with backoff
REPAIR_RETRY_MAX_S = 30.0


_SlaveLog = tuple[int, int, list[IncarnationEntry] | None]  # a slave's min, max offset and history


class RecoveryError(MqdError):
    """A partition whose slave copy cannot be appended (divergent batches): reported, not applied."""


@dataclass(slots=True)
class RecoveryResult:
    consulted: list[str] = field(default_factory=list)  # slaves that answered
    copied: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> records copied back
    # "topic/partition" -> ranges fenced because the slave's copy had them damaged or fenced
    fenced: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
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
        self._repair_task: asyncio.Task[None] | None = None
        self._repair_wanted = asyncio.Event()
        self.fenced_repaired = 0  # offsets of fenced ranges repaired at runtime (repair_soon)
        # partitions a failed round copied into (or adopted a slave's history for) and no later round
        # finished: they get a new incarnation before writes are taken without a slave
        self._partial: set[tuple[str, int]] = set()

    async def good_copy(self, plog: PartitionLog, first: int, last: int) -> bytes | None:
        """A slave's intact batches for exactly ``first..last`` (the scrub found ours damaged), or
        None when no slave answers with them."""
        if self.writes_refused is not None:
            return None  # still recovering: the start-up attempt repairs
        for slave in self._slaves:
            try:
                data = await read_range(self._client, slave, plog.topic, plog.partition, first, last)
            except (BrokerError, ProtocolError, fmt.BatchError) as exc:
                log.warning("slave cannot give a damaged range", slave=slave.id, first=first, error=str(exc))
                continue
            if data is not None:
                return data
        return None

    def repair_soon(self) -> None:
        """A range was fenced at runtime (scrub.py): ask the slaves for it, now and with backoff
        while ranges remain fenced."""
        self._repair_wanted.set()

    def _marked(self) -> bool:
        return read_marker(self._data_dir) is not None

    async def start(self) -> None:
        """Consult the slaves once (bounded); with no marker and no slave answering, refuse writes
        and keep trying in the background."""
        self._repair_task = asyncio.create_task(self._repair_loop(), name="master-fenced-repair")
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
            self._take_writes_as_is()
            return
        self._task = asyncio.create_task(self._retry_loop(), name="master-recovery")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._repair_task) if t is not None]
        self._task = self._repair_task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _repair_loop(self) -> None:
        """Repairs ranges fenced after start from the slaves; backs off while some stay fenced
        (no slave holds them whole, or none answers)."""
        backoff = Backoff(REPAIR_RETRY_BASE_S, REPAIR_RETRY_MAX_S)
        while True:
            await self._repair_wanted.wait()
            self._repair_wanted.clear()
            left = True
            if self.writes_refused is None:  # still recovering: that attempt repairs as well
                try:
                    left = await self._repair_all()
                except Exception:
                    log.exception("repair of fenced ranges failed", node=self.node_id)
            if not left:
                backoff.reset()
                continue
            await asyncio.sleep(backoff.next())
            self._repair_wanted.set()

    async def _repair_all(self) -> bool:
        """One round over every slave; True while some partition still has fenced ranges."""
        result = RecoveryResult()
        for slave in self._slaves:
            await self._repair_fenced(slave, result)
        self.fenced_repaired += sum(result.copied.values())
        return any(
            plog.fenced_ranges() for t, p in self._partitions if (plog := self._storage.get(t, p)) is not None
        )

    async def _retry_loop(self) -> None:
        backoff = Backoff(0.2, RETRY_MAX_S)
        while True:
            await asyncio.sleep(backoff.next())
            if self._marked():
                log.warning(
                    "operator accepted the data dir (node marker written): taking writes", node=self.node_id
                )
                self._take_writes_as_is()
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
                copied = await self._copy(spec, topic, partition, slave_max, result)
            except (RecoveryError, StorageError, fmt.BatchError, BrokerError, ProtocolError) as exc:
                problem = f"{topic}/{partition}: cannot copy back from {slave_id}: {exc}"
                log.error("master recovery: partition not recovered", node=self.node_id, problem=problem)
                result.problems.append(problem)
                if isinstance(exc, BrokerError):
                    # the slave went away mid-copy: the whole round is tried again, writes refused
                    # meanwhile. What we copied is the slave's records under their names, so no new
                    # incarnation yet: one at our end now would tell every consumer that the
                    # offsets before it hold other records (chaos seed 199203: 241,060 landed twice)
                    if prepared:
                        self._partial.add(key)
                    return False
                if prepared:
                    self._new_incarnation(plog, "copy-back from a slave stopped before its log end")
                    self._partial.discard(key)
                continue
            self._new_incarnation(plog, "records taken back from a slave")
            self._partial.discard(key)
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
        self._take_writes_as_is()  # a partition left partial by an earlier round and not copied now
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

    def _take_writes_as_is(self) -> None:
        """Open writes without a finished copy-back: a partition a failed round copied into ends
        where that copy ended, so the offsets written next get a new incarnation (_new_incarnation)."""
        for topic, partition in sorted(self._partial):
            plog = self._storage.get(topic, partition)
            if plog is not None:
                self._new_incarnation(plog, "copy-back from a slave stopped before its log end")
        self._partial.clear()
        self.writes_refused = None

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

    async def _copy(
        self, slave: NodeSpec, topic: str, partition: int, slave_max: int, result: RecoveryResult
    ) -> int:
        """Copy the slave's log from our end to ``slave_max``; returns the records appended. A
        damaged batch in the slave's copy (CRC) or a range the slave has fenced is fenced here,
        exactly, and the copy goes on after it: nothing intact is left behind."""
        plog = self._storage.get(topic, partition)
        assert plog is not None
        copied = 0
        while plog.max_offset < slave_max:
            at = plog.max_offset
            p = await self._fetch_one(slave, topic, partition, at, COPY_MAX_BYTES)
            if p.status is Status.OFFSET_OVERFLOW_BADLY and at < p.max_offset:
                # a slave answers so inside a range it has fenced itself (offset_check.py)
                last = await self._slave_hole_last(slave, topic, partition, at, min(slave_max, p.max_offset))
                self._fence_copy(plog, at, last, slave.id, "fenced on the slave", result)
                continue
            if p.status is not Status.FOUND or len(p.data) == 0:
                raise RecoveryError(f"slave answered {p.status} at offset {at}")
            data = bytes(p.data)
            infos, valid = fmt.scan_valid_prefix(data)
            if infos and infos[0].base_offset < at:
                raise RecoveryError(
                    f"slave batch starts at {infos[0].base_offset}, our log ends at {at} (the logs diverged)"
                )
            expected = at
            for n, info in enumerate(infos):
                if info.base_offset != expected:  # the CRC does not cover it: a flipped base offset
                    infos, valid = infos[:n], info.position
                    break
                expected = info.next_offset
            if infos:
                plog.append_replica(data[:valid], infos)
                copied += sum(info.count for info in infos)
            if valid == len(data):
                continue
            # a damaged batch at our log end: it reaches the next intact batch of the answer, or
            # the answer's end (the slave sends whole batches by its index: next_offset is theirs)
            damaged_at = plog.max_offset
            after = find_intact_batch(data, data, valid + 8, damaged_at, p.next_offset)
            end = after.base_offset if after is not None else p.next_offset
            if end <= damaged_at:
                raise RecoveryError(f"slave batch at offset {damaged_at} is damaged and its end is unknown")
            self._fence_copy(plog, damaged_at, end - 1, slave.id, "damaged in the slave's copy (CRC)", result)
        return copied

    async def _fetch_one(
        self, slave: NodeSpec, topic: str, partition: int, offset: int, max_bytes: int
    ) -> PartitionFetch:
        answer: FetchAnswer = await self._client.fetch(
            slave,
            [{"topic": topic, "partition": partition, "offset": offset, "max_bytes": max_bytes}],
            max_wait_ms=0,
            max_bytes=max_bytes,
        )
        return answer.partitions[0]

    async def _slave_hole_last(
        self, slave: NodeSpec, topic: str, partition: int, first: int, end: int
    ) -> int:
        """The last offset of the range the slave has fenced from ``first`` (it answers FOUND again
        from the offset after it), found by doubling then bisecting; ``end - 1`` when it reaches the
        slave's log end. The first FOUND offset after a hole is the base of the batch after it."""
        missing, found = first, None
        step = 1
        while found is None:
            probe = min(first + step, end - 1)
            if probe <= missing:
                return end - 1
            p = await self._fetch_one(slave, topic, partition, probe, 1)
            if p.status is Status.FOUND:
                found = probe
            elif p.status is Status.OFFSET_OVERFLOW_BADLY:
                missing = probe
                step *= 2
            else:
                raise RecoveryError(f"slave answered {p.status} at offset {probe}")
        while found - missing > 1:
            mid = (missing + found) // 2
            p = await self._fetch_one(slave, topic, partition, mid, 1)
            if p.status is Status.FOUND:
                found = mid
            else:
                missing = mid
        return found - 1

    def _fence_copy(
        self, plog: PartitionLog, first: int, last: int, slave_id: str, why: str, result: RecoveryResult
    ) -> None:
        """Continue our log with ``first..last`` fenced (the slave cannot give them intact)."""
        plog.append_fenced(first, last)
        key = f"{plog.topic}/{plog.partition}"
        result.fenced.setdefault(key, []).append((first, last))
        log.error(
            "master recovery: range fenced, the copy-back goes on after it",
            node=self.node_id,
            slave=slave_id,
            topic=plog.topic,
            partition=plog.partition,
            first_offset=first,
            last_offset=last,
            why=why,
        )
