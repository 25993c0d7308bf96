"""The steady produce load of a chaos run, and its ledger of acknowledged records (the truth).

One coroutine per partition sends a batch to the partition's master (through its proxy) with
``acks=all``, never retrying: an error means "not acknowledged", whatever happened on the broker. An
answer is taken as an acknowledgement only if it is self-consistent for what was sent (a corrupted
answer that still parses must not become a false truth).

Every record's value names its partition and a sequence number: it is the record's payload id,
unique in the run. Each acknowledged record goes to the :class:`~mqd_dev.chaos.ledger.Ledger` as it
arrives; the end check counts payload ids from it, so it does not depend on offsets, which a new log
incarnation may reuse.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd_dev.chaos.ledger import Ledger
from mqd_dev.chaos.procs import ChaosCluster


def record_value(partition: int, seq: int) -> bytes:
    return b"p%05d-s%010d" % (partition, seq)


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    base_offset: int
    count: int
    first_seq: int  # record i holds record_value(partition, first_seq + i)
    generation: int = 0  # the partition's log generation (bumped when the run deletes the log)


class ProduceLoad:
    def __init__(
        self,
        client: BrokerClient,
        cluster: ChaosCluster,
        *,
        batch_records: int,
        interval: float,
        ledger: Ledger,
        before_start: bool = False,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.topic = cluster.topic
        self.batch_records = batch_records
        self.interval = interval
        self.ledger = ledger
        self.acks: list[Ack] = []
        self.acked_end: dict[int, int] = {p: 0 for p in range(cluster.partitions)}  # offset after last ack
        self.errors: Counter[str] = Counter()
        self.sent_records = 0
        # -1: acknowledged before the daemons' first start with consume_from = "last" (not expected to land)
        first = -1 if before_start else 0
        self.generation: dict[int, int] = {p: first for p in range(cluster.partitions)}
        self._seq: dict[int, int] = {p: 0 for p in range(cluster.partitions)}
        self._paused: set[int] = set()
        self._inflight: set[int] = set()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_ack_time = 0.0

    @property
    def acknowledged(self) -> int:
        return sum(a.count for a in self.acks)

    def start(self) -> None:
        self.ledger.start()
        if not self._tasks:
            self._stop.clear()
            self._tasks = [asyncio.create_task(self._run(p)) for p in range(self.cluster.partitions)]

    async def stop(self) -> None:
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks, return_exceptions=True)
        self.ledger.flush()

    async def pause(self, partitions: list[int], timeout: float = 30.0) -> None:
        """Stop producing to ``partitions`` and wait until none of their produces is in flight."""
        self._paused.update(partitions)
        await wait_until(lambda: not self._inflight & set(partitions), timeout, "in-flight produces to end")

    def resume(self, partitions: list[int]) -> None:
        self._paused.difference_update(partitions)

    def daemons_started(self) -> None:
        """Records acknowledged from now on must land (ends generation -1)."""
        for p, g in self.generation.items():
            self.generation[p] = max(g, 0)

    def new_generation(self, partitions: list[int]) -> None:
        """The run deleted these partitions' logs: later acks start a new generation at offset 0."""
        for p in partitions:
            self.generation[p] += 1
            self.acked_end[p] = 0

    async def _run(self, partition: int) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            if partition not in self._paused:
                self._inflight.add(partition)
                try:
                    await self.produce_once(partition)
                finally:
                    self._inflight.discard(partition)
            pause = max(0.0, self.interval - (time.monotonic() - started))
            try:
                await asyncio.wait_for(self._stop.wait(), pause)
            except TimeoutError:
                pass

    async def produce_once(self, partition: int) -> Ack | None:
        n = self.batch_records
        first = self._seq[partition]
        self._seq[partition] = first + n
        payloads = [record_value(partition, first + i) for i in range(n)]
        batch = fmt.encode_batch(payloads)
        self.sent_records += n
        url = self.cluster.master_of(partition).url
        try:
            r = await self.client.produce(url, self.topic, partition, batch, acks="all")
        except BrokerError as exc:
            self.errors[exc.code or "transport"] += 1
            return None
        except (ValueError, KeyError, TypeError) as exc:  # an answer that does not parse
            self.errors[f"bad_answer:{type(exc).__name__}"] += 1
            return None
        span = r.last_offset - r.base_offset + 1
        if (r.topic, r.partition, r.count, span) != (self.topic, partition, n, n):
            self.errors["inconsistent_answer"] += 1
            return None
        generation = self.generation[partition]
        ack = Ack(partition, r.base_offset, n, first, generation)
        self.acks.append(ack)
        self.ledger.record(self.topic, partition, r.base_offset, payloads, generation)
        self.acked_end[partition] = max(self.acked_end[partition], r.last_offset + 1)
        self.last_ack_time = time.monotonic()
        return ack
