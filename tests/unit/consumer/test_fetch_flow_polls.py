"""Flow polls (decision 078; the fetcher's ``_round``): while records flow, a poll at the log end
asks the broker to wait for ``flow_min_bytes`` up to ``flow_wait_ms``, and its records' age counts
from the poll's send.

Before: every long poll asked for one byte, so at a steady 50,000 records/s the broker answered
each new record at once, hundreds of answers a second of a few records each, and the daemon spent
twice the CPU on them. The fetchers run for real on the loop; the source answers only when the test
says so and writes down what each request asked the broker to wait for."""

from __future__ import annotations

import time
from typing import Any

from support.fetch_answers import batches, layout
from support.held_source import HeldSource

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager
from mqd.waiting import wait_until
from mqd.wire.protocol import Status

TP = TopicPartition("events", 0)
MIB = 1024 * 1024


def _running(**cfg: Any) -> tuple[HeldSource, FetchManager]:
    """One partition on the master ``m``, at offset 0 with a log end of 100."""
    config = ConsumerConfig(**{"bootstrap": ["http://127.0.0.1:1"], "fetch_max_wait_ms": 500, **cfg})
    source = HeldSource(config, layout(partitions=1))
    state = SubscriptionState(FlowLimits(max_queued_records=10_000), ByteBudget(config.max_buffered_bytes))
    manager = FetchManager(config=config, source=source, state=state, jitter=0.0)
    state.assign(TP, 0, "m").log_end = 100
    manager.start()
    return source, manager


async def _next_request(source: HeldSource, count: int) -> tuple[str, int, int]:
    await wait_until(lambda: len(source.waits) > count and "m" in source.pending, 5, f"request {count + 1}")
    return source.waits[count]


async def _request_after_records(source: HeldSource) -> tuple[str, int, int]:
    """The first request answered with records up to the log end; what the next one asks for."""
    await _next_request(source, 0)
    source.answer("m", TP, Status.FOUND, 100, 100, batches((0, 100)))
    return await _next_request(source, 1)


def _flow_polls() -> float:
    return metrics.REGISTRY.get_sample_value("mqd_fetch_flow_polls_total", {"node": "m"}) or 0.0


async def test_a_poll_after_records_waits_for_more_and_an_idle_one_for_the_first() -> None:
    """A backlog is fetched without a wait for bytes; the poll after an answer that reached the log
    end with records is a flow poll (1 MiB, 100 ms); the poll after an answer with nothing new is
    the plain long poll again (one byte, fetch_max_wait_ms), which the first new record ends."""
    polls = _flow_polls()
    source, manager = _running()
    try:
        assert await _next_request(source, 0) == ("m", 500, 1)  # a backlog: data is there
        source.answer("m", TP, Status.FOUND, 100, 100, batches((0, 100)))
        assert await _next_request(source, 1) == ("m", 100, MIB)  # at the log end, records flowing
        assert _flow_polls() == polls + 1
        source.answer("m", TP, Status.FOUND, 130, 130, batches((100, 30)))
        assert await _next_request(source, 2) == ("m", 100, MIB)
        source.answer_caught_up("m", TP, 130)  # the flow stopped
        assert await _next_request(source, 3) == ("m", 500, 1)
        source.answer("m", TP, Status.FOUND, 131, 131, batches((130, 1)))
        assert await _next_request(source, 4) == ("m", 100, MIB)
    finally:
        await manager.stop()


async def test_records_behind_the_answer_are_fetched_without_a_wait_for_bytes() -> None:
    """An answer that did not reach the log end leaves a backlog: the next request, sent ahead of
    the answer's decoding, asks for one byte, so a burst's last records never wait at the broker
    for bytes that are not coming."""
    source, manager = _running()
    try:
        await _next_request(source, 0)
        source.answer("m", TP, Status.FOUND, 40, 100, batches((0, 40)))
        assert await _next_request(source, 1) == ("m", 500, 1)
        source.answer("m", TP, Status.FOUND, 100, 100, batches((40, 60)))
        assert await _next_request(source, 2) == ("m", 100, MIB)
    finally:
        await manager.stop()


async def test_a_flow_polls_records_are_as_old_as_the_poll() -> None:
    """The landing's max_age clock of records a flow poll brought starts when the poll was sent
    (the broker may have held them since), so max_age still bounds their latency; records of a
    plain poll start when the answer came."""
    source, manager = _running()
    try:
        await _next_request(source, 0)
        plain_answered = time.monotonic()
        source.answer("m", TP, Status.FOUND, 100, 100, batches((0, 100)))
        await _next_request(source, 1)  # the flow poll is out
        sent_by = time.monotonic()
        await wait_until(lambda: time.monotonic() > sent_by, 5, "the clock moves on")
        source.answer("m", TP, Status.FOUND, 110, 110, batches((100, 10)))
        await wait_until(lambda: manager.state.partitions[TP].position == 110, 5, "the answer applied")
        got = manager.state.drain(None)
        plain, flowed = [b for b in got if b.first_offset < 100], [b for b in got if b.first_offset >= 100]
        assert plain and flowed
        assert all(b.fetched_at >= plain_answered for b in plain)  # counted from the answer
        assert all(b.fetched_at <= sent_by for b in flowed)  # counted from the send
    finally:
        await manager.stop()


async def test_flow_wait_zero_keeps_every_poll_plain() -> None:
    """``flow_wait_ms = 0`` turns flow polls off: the poll after records asks for one byte."""
    source, manager = _running(flow_wait_ms=0)
    try:
        assert await _request_after_records(source) == ("m", 500, 1)
    finally:
        await manager.stop()


async def test_a_flow_poll_never_waits_longer_than_fetch_max_wait_ms() -> None:
    """A fetch_max_wait_ms below flow_wait_ms bounds the flow poll too."""
    source, manager = _running(fetch_max_wait_ms=40)
    try:
        assert await _request_after_records(source) == ("m", 40, MIB)
    finally:
        await manager.stop()


def test_the_daemon_keeps_the_flow_wait_under_a_tenth_of_max_age() -> None:
    """The landing counts a flow poll's records from the poll's send, so a wait near max_age would
    only make younger files: the daemon's consumer waits at most a tenth of ``landing.max_age``."""
    from mqd.config import MqdConfig
    from mqd.process.daemon import _consumer_config

    def flow_wait(max_age: float, **consumer: Any) -> int:
        cfg = MqdConfig.model_validate(
            {
                "consumer": {"bootstrap": ["http://127.0.0.1:1"], **consumer},
                "landing": {"dir": "/tmp/landing", "max_age": max_age},
            }
        )
        return _consumer_config(cfg).flow_wait_ms

    assert flow_wait(60.0) == 100  # the default, well under 6 s
    assert flow_wait(0.5) == 50
    assert flow_wait(1.0, flow_wait_ms=400) == 100
    assert flow_wait(1.0, flow_wait_ms=0) == 0
