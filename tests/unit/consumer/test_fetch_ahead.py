"""Fetching ahead: a node's next request goes out before the last answer is decoded, and an answer
fetched ahead of records that ended elsewhere is never applied.

The node fetcher runs for real on the loop (its coroutine, its done-callbacks); the source is the mqd
broker's, with real answer framing and real batches, and only its ``fetch`` is scripted: each
requested offset gets the answer the test wrote for it, so the order of requests and decodes, and
what reaches the process queue, are exactly observable."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from support.fetch_answers import batches, layout

from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager
from mqd.consumer.source import Decoded, FetchRequest, FetchResult
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.waiting import cancel_and_wait, wait_event, wait_until
from mqd.wire.metadata import ClusterMetadata
from mqd.wire.protocol import Status, decode_fetch_answer, encode_fetch_answer

TP = TopicPartition("events", 0)
LAYOUT = {
    "groups": [
        {"name": "g", "nodes": [{"id": "m", "url": "http://127.0.0.1:1", "role": "master", "alive": True}]}
    ],
    "topics": [
        {"name": "events", "partitions": [{"partition": 0, "group": "g", "master": "m", "replicas": []}]}
    ],
}


def found_answer(node_id: str, parts: list[tuple[int, int, bytes, str | None]]) -> FetchResult:
    """A FOUND answer of ``node_id``, through the real answer framing: (partition, next offset,
    data, suggested node) per partition."""
    entries = [
        {
            "topic": TP.topic,
            "partition": partition,
            "status": Status.FOUND.value,
            "next_offset": nxt,
            "min_offset": 0,
            "max_offset": 1000,
            "suggest": suggest,
        }
        for partition, nxt, _data, suggest in parts
    ]
    answer = b"".join(encode_fetch_answer(node_id, entries, [data for _p, _n, data, _s in parts]))
    return MqdBrokerSource._result(decode_fetch_answer(answer))


async def travel() -> None:
    """The answer travels: other callbacks (the drain) run meanwhile."""
    for _ in range(3):
        await asyncio.sleep(0)


class ScriptedSource(MqdBrokerSource):
    """The mqd broker source with ``fetch`` answering from a script: requested offset -> (next
    offset, data). An offset without an entry long-polls until the test ends. ``events`` records
    ("send", offset) when a request is written and ("decode", offset) when an answer is decoded."""

    def __init__(self, config: ConsumerConfig, script: dict[int, tuple[int, bytes]]) -> None:
        super().__init__(config)
        self.metadata.current = ClusterMetadata.parse(LAYOUT)
        self.script = script
        self.events: list[tuple[str, int]] = []
        self.idle = asyncio.Event()  # set when a request found nothing scripted

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Any:
        return self._answer(requests)

    async def _answer(self, requests: list[FetchRequest]) -> FetchResult:
        (r,) = requests
        self.events.append(("send", r.offset))
        if r.offset not in self.script:
            self.idle.set()
            await asyncio.Event().wait()  # a long poll that outlives the test (cancelled at stop)
        await travel()
        nxt, data = self.script[r.offset]
        result = found_answer("m", [(TP.partition, nxt, data, None)])
        (res,) = result.partitions
        return dataclasses.replace(
            result, partitions=[dataclasses.replace(res, decode=self._traced(res.decode, r.offset))]
        )

    def _traced(self, decode: Callable[[int, bool], Decoded], offset: int) -> Callable[[int, bool], Decoded]:
        def traced(start: int, check_crc: bool) -> Decoded:
            self.events.append(("decode", offset))
            return decode(start, check_crc)

        return traced


async def run_fetcher(script: dict[int, tuple[int, bytes]], **cfg: Any) -> tuple[ScriptedSource, list[int]]:
    """Fetch TP from offset 0 until a request finds nothing scripted; the offsets that reached the
    process queue, in order."""
    config = ConsumerConfig(**{"error_backoff_ms": 10, "bootstrap": ["http://127.0.0.1:1"], **cfg})
    source = ScriptedSource(config, script)
    state = SubscriptionState(
        FlowLimits(max_queued_records=10**6, max_offset_span=10**6), ByteBudget(config.max_buffered_bytes)
    )
    m = FetchManager(config=config, source=source, state=state, jitter=0.0)
    offsets: list[int] = []

    async def drain() -> None:  # the daemon's part: take what is buffered, which frees the budget
        while True:
            await state.data_ready.wait()
            offsets.extend(o for b in state.drain() for o in b.records.column("offset").to_pylist())

    state.assign(TP, 0, "m")
    m.start()
    drainer = asyncio.create_task(drain())
    try:
        assert await wait_event(source.idle, 10), "the fetcher never reached the script's end"
    finally:
        await m.stop()
        await cancel_and_wait(drainer)
    offsets.extend(o for b in state.drain() for o in b.records.column("offset").to_pylist())
    return source, offsets


async def test_the_next_request_goes_out_before_the_answer_is_decoded() -> None:
    """Each request after the first is written before the previous answer is decoded (so the node
    works on it meanwhile), and every record reaches the queue once, in order."""
    script = {0: (10, batches((0, 10))), 10: (20, batches((10, 10))), 20: (30, batches((20, 10)))}
    source, offsets = await run_fetcher(script)
    ev = source.events
    assert ev.index(("send", 10)) < ev.index(("decode", 0))
    assert ev.index(("send", 20)) < ev.index(("decode", 10))
    assert ev.index(("send", 30)) < ev.index(("decode", 20))
    assert offsets == list(range(30))


async def test_an_answer_fetched_ahead_of_records_that_ended_early_is_dropped() -> None:
    """The answer at 0 frames records up to 20, but its second batch is corrupt: the records end at
    10. The request already sent from 20 must not be applied (offsets 10..19 would be lost); after
    its backoff the partition is fetched from 10 again, and nothing is skipped or doubled."""
    good, bad = batches((0, 10)), bytearray(batches((10, 10)))
    bad[-1] ^= 0xFF
    script = {
        0: (20, good + bytes(bad)),
        20: (30, batches((20, 10))),  # fetched ahead, from where the corrupt answer's framing ended
        10: (30, batches((10, 20))),  # the retry from where the records really ended
    }
    source, offsets = await run_fetcher(script)
    assert ("send", 20) in source.events and ("send", 10) in source.events
    assert offsets == list(range(30))


async def test_an_answer_fetched_ahead_of_a_clipped_answer_is_dropped() -> None:
    """The byte budget takes only the first of an answer's two batches: the request already sent
    from where the answer ended is dropped, and the partition goes on from the clip."""
    one = len(batches((0, 10)))
    script = {
        0: (20, batches((0, 10), (10, 10))),
        20: (30, batches((20, 10))),  # fetched ahead, must not land after 0..9
        10: (30, batches((10, 20))),
    }
    source, offsets = await run_fetcher(script, max_buffered_bytes=one + one // 2)
    assert ("send", 20) in source.events
    assert offsets[:10] == list(range(10)) and offsets == list(range(len(offsets)))


REPLICATED = layout(partitions=2)
TP1 = TopicPartition("events", 1)
Script = dict[tuple[str, int, int], tuple[int, bytes, str | None]]


class RoutedSource(MqdBrokerSource):
    """The mqd broker source answering from a script per (node, partition, offset) -> (next offset,
    data, suggested node). A request with nothing scripted for any of its partitions long-polls
    until the test ends; ``sent`` records (node, partition, offset) of every request, and
    ``on_answer`` sees the scripted keys of each answer before it returns."""

    def __init__(self, config: ConsumerConfig, script: Script) -> None:
        super().__init__(config)
        self.metadata.current = ClusterMetadata.parse(REPLICATED)
        self.script = script
        self.sent: list[tuple[str, int, int]] = []
        self.on_answer: Callable[[list[tuple[str, int, int]]], None] = lambda found: None

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Any:
        return self._answer(node_id, requests)

    async def _answer(self, node_id: str, requests: list[FetchRequest]) -> FetchResult:
        keys = [(node_id, r.tp.partition, r.offset) for r in requests]
        self.sent.extend(keys)
        found = [k for k in keys if k in self.script]
        if not found:
            await asyncio.Event().wait()  # a long poll that outlives the test (cancelled at stop)
        await travel()
        self.on_answer(found)
        return found_answer(node_id, [(p, *self.script[(node, p, offset)]) for node, p, offset in found])


async def test_an_answer_for_an_offset_the_partition_left_is_never_applied() -> None:
    """The master suggests its slave for partition 0 in the answer that the request sent ahead
    follows (0 and 1 both from 10). When that request returns, the master's next request sent
    ahead (partition 1 only) defers its handling, and a drain wakes the slave's fetcher meanwhile,
    which asks for partition 0 from 10 too: one of the two answers for 10..19 must be dropped, not
    appended twice (the hot shape's duplicate cut and stall)."""
    script: Script = {
        ("m", 0, 0): (10, batches((0, 10)), "s"),
        ("m", 1, 0): (10, batches((0, 10)), None),
        ("m", 0, 10): (20, batches((10, 10)), None),
        ("m", 1, 10): (20, batches((10, 10)), None),
        ("s", 0, 10): (20, batches((10, 10)), None),
    }
    config = ConsumerConfig(error_backoff_ms=10, bootstrap=["http://127.0.0.1:1"])
    source = RoutedSource(config, script)
    state = SubscriptionState(
        FlowLimits(max_queued_records=10**6, max_offset_span=10**6), ByteBudget(config.max_buffered_bytes)
    )

    def budget_waits(found: list[tuple[str, int, int]]) -> None:
        if ("m", 0, 10) in found:
            state.budget.wait("m")  # a fetcher found no room meanwhile: this answer's release wakes all

    source.on_answer = budget_waits
    m = FetchManager(config=config, source=source, state=state, jitter=0.0)
    got: dict[int, list[int]] = {0: [], 1: []}

    def take() -> None:
        for b in state.drain():
            got[b.tp.partition].extend(b.records.column("offset").to_pylist())

    async def drain() -> None:  # the daemon's part; a drain wakes every fetcher (the budget's room)
        while True:
            await state.data_ready.wait()
            take()
            m.wake()

    state.assign(TP, 0, "m")
    state.assign(TP1, 0, "m")
    m.start()
    drainer = asyncio.create_task(drain())
    try:
        await wait_until(lambda: ("s", 0, 20) in source.sent and ("m", 1, 20) in source.sent, 10, "the ends")
    finally:
        await m.stop()
        await cancel_and_wait(drainer)
    take()
    assert got[1] == list(range(20))
    assert got[0] == list(range(20)), (got[0], source.sent)
