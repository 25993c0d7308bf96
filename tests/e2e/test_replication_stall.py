"""A slave's replication never stops without a word (make chaos seed 529091, issue of session 6).

In that run a slave stopped replicating for good, with no log line and no error in /v1/stats: the
fault proxy inverted one byte of the ``X-Mqd-Replica-Signature`` header of a replica fetch answer,
aiohttp kept the byte as a surrogate escape, and the answer check's ``sig.encode()`` raised a
``UnicodeEncodeError`` that no caller caught, so the slave's fetch loop task ended silently while its
committed-offsets loop went on. Real master and slave processes, the master behind a proxy that
inverts exactly that byte.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from mqd_dev.chaos.procs import ChaosCluster
from mqd_dev.chaos.proxy import FaultProxy

from mqd import format as fmt
from mqd.broker.replica_auth import HEADER_SIGNATURE
from mqd.client import BrokerClient
from mqd.protocol import FETCH_CONTENT_TYPE
from mqd.waiting import wait_until

TOPIC = "events"
_MARK = f"\r\n{HEADER_SIGNATURE}: ".encode()


class SignatureFlipProxy(FaultProxy):
    """The chaos proxy, transparent, except that while ``armed`` > 0 it inverts the first byte of
    the signature header of the next replica fetch answers (one per arming), as ``net_corrupt`` did."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.armed = 0
        self.flipped = 0

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                at = chunk.find(_MARK)
                if self.armed > 0 and at >= 0 and FETCH_CONTENT_TYPE.encode() in chunk:
                    at += len(_MARK)
                    chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1 :]
                    self.armed -= 1
                    self.flipped += 1
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            return


async def _replication(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/stats") as resp:
        body = await resp.json()
    rep = body["replication"]
    assert isinstance(rep, dict)
    return rep


async def test_corrupted_signature_header_does_not_stop_replication(tmp_path: Path) -> None:
    """An answer whose signature header arrives with one byte inverted is refused as unverified
    (counted in ``unverified_answers``) and the slave keeps replicating: records the master takes
    afterwards reach the slave. On main the fetch loop died on the UnicodeEncodeError and the slave
    never copied another record."""
    cluster = ChaosCluster(tmp_path, topic=TOPIC, partitions=1, groups=1, slaves=1, seed=1)
    master, slave = cluster.masters()[0], cluster.slaves()[0]
    proxy = SignatureFlipProxy(master.port)
    master.proxy = proxy  # the cluster file names it: the slave replicates through it
    await cluster.start()
    try:
        async with BrokerClient(request_timeout=5.0) as client:

            async def slave_end(at_least: int) -> bool:
                parts = (await _replication(slave.direct_url))["partitions"]
                return bool(parts[0]["max_offset"] is not None and parts[0]["max_offset"] >= at_least)

            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"before"] * 10))
            await wait_until(lambda: slave_end(10), 30, "the slave copies the first batch")

            proxy.armed = 1
            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"flipped"] * 10))
            await wait_until(lambda: proxy.flipped == 1, 30, "an answer with a corrupted signature header")

            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"after"] * 10))
            # the slave backs off at most 2 s after a refused answer, then asks again
            await wait_until(lambda: slave_end(30), 20, "the slave copies the batches after the fault")
            rep = await _replication(slave.direct_url)
            assert rep["unverified_answers"] >= 1, rep
            assert rep["loop_restarts"] == 0, rep  # refused by the client check, not by the supervisor
    finally:
        await cluster.stop()
