"""The steady produce load of a chaos run, and its ledger of acknowledged records (the truth).

One coroutine per partition sends a batch to the partition's master (through its proxy) with
``acks=all``, never retrying: an error means "not acknowledged", whatever happened on the broker. An
answer is taken as an acknowledgement only if it is self-consistent for what was sent (a corrupted
answer that still parses must not become a false truth).

Every record's value names its partition and a sequence number, so the end check can verify not only
that an offset landed but that it holds the record the broker acknowledged there.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

from mqd import format as fmt
from mqd.client import BrokerClient, BrokerError
from mqd_dev.chaos.procs import ChaosCluster


def record_value(partition: int, seq: int) -> bytes:
    return b"p%05d-s%010d" % (partition, seq)


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    base_offset: int
    count: int
    first_seq: int  # record i holds record_value(partition, first_seq + i)


class ProduceLoad:
    def __init__(
        self,
        client: BrokerClient,
        cluster: ChaosCluster,
        *,
        batch_records: int,
        interval: float,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.topic = cluster.topic
        self.batch_records = batch_records
        self.interval = interval
        self.acks: list[Ack] = []
        self.acked_end: dict[int, int] = {p: 0 for p in range(cluster.partitions)}  # offset after last ack
        self.errors: Counter[str] = Counter()
        self.sent_records = 0
        self._seq: dict[int, int] = {p: 0 for p in range(cluster.partitions)}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_ack_time = 0.0

    @property
    def acknowledged(self) -> int:
        return sum(a.count for a in self.acks)

    def start(self) -> None:
        if not self._tasks:
            self._stop.clear()
            self._tasks = [asyncio.create_task(self._run(p)) for p in range(self.cluster.partitions)]

    async def stop(self) -> None:
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, partition: int) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            await self.produce_once(partition)
            pause = max(0.0, self.interval - (time.monotonic() - started))
            try:
                await asyncio.wait_for(self._stop.wait(), pause)
            except TimeoutError:
                pass

    async def produce_once(self, partition: int) -> Ack | None:
        n = self.batch_records
        first = self._seq[partition]
        self._seq[partition] = first + n
        batch = fmt.encode_batch([record_value(partition, first + i) for i in range(n)])
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
        ack = Ack(partition, r.base_offset, n, first)
        self.acks.append(ack)
        self.acked_end[partition] = max(self.acked_end[partition], r.last_offset + 1)
        self.last_ack_time = time.monotonic()
        return ack
