"""A fault-injecting TCP proxy for chaos runs: sits between clients and one broker node.

It is protocol-agnostic (bytes in, bytes out) so it can break what a real network breaks: slow
answers, connection resets mid-answer, truncated and corrupted answers, a node that accepts and never
answers. Faults apply to the answer direction (node -> client) and are decided per chunk read from
the node, against the faults in force *now*: HTTP clients keep connections alive for minutes, so a
per-connection decision would leave the pooled connections untouched during a fault window.

The draws come from a seeded generator, so which kinds of faults a run injects is reproducible given
its seed; the exact bytes hit depend on how the kernel chunks the stream, which is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

_CHUNK = 65536


@dataclass
class Faults:
    """Probabilities per answer chunk (each in [0, 1]); all zero is a transparent proxy."""

    delay: float = 0.0
    delay_s: float = 0.3  # mean delay; each one is drawn from [0.5, 1.5] times this
    reset: float = 0.0  # forward part of the chunk, then abort both sides (RST)
    corrupt: float = 0.0  # invert one byte of the chunk
    truncate: float = 0.0  # forward part of the chunk, then close cleanly (FIN)
    blackhole: bool = False  # accept, never answer (a hung node)

    def any(self) -> bool:
        return bool(self.delay or self.reset or self.corrupt or self.truncate or self.blackhole)

    def validate(self) -> None:
        for name in ("delay", "reset", "corrupt", "truncate"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"fault probability {name}={p} is not in [0, 1]")
        if self.reset + self.truncate + self.corrupt > 1.0:
            raise ValueError("reset + truncate + corrupt must not exceed 1")
        if self.delay_s < 0:
            raise ValueError("delay_s must be >= 0")


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0  # the node behind did not accept (down): the client's connection is closed
    injected: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + 1


class FaultProxy:
    """Listen on ``listen_port`` (0 = pick one) on 127.0.0.1, forward to ``target_port`` there."""

    def __init__(self, target_port: int, listen_port: int = 0, *, seed: int = 0) -> None:
        self.target_port = target_port
        self.listen_port = listen_port
        self._faults = Faults()
        self.stats = ProxyStats()
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._unblocked = asyncio.Event()
        self._unblocked.set()

    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        faults.validate()
        self._faults = faults
        if faults.blackhole:
            self._unblocked.clear()
        else:
            self._unblocked.set()

    def clear(self) -> None:
        self.faults = Faults()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    async def start(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)
        self.listen_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        swriter: asyncio.StreamWriter | None = None
        try:
            if self._faults.blackhole:
                self.stats.count("blackhole")
                await self._unblocked.wait()
            try:
                sreader, swriter = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                self.stats.refused += 1
                return
            up = asyncio.create_task(self._forward(creader, swriter))
            down = asyncio.create_task(self._answer(sreader, cwriter))
            _done, pending = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        except (ConnectionError, OSError):
            pass
        finally:
            if swriter is not None:
                swriter.close()
            cwriter.close()
            self._tasks.discard(task)

    @staticmethod
    async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client -> node, untouched."""
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(_CHUNK):
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Node -> client, with the faults in force when each chunk arrives."""
        try:
            while chunk := await reader.read(_CHUNK):
                if not self._unblocked.is_set():
                    self.stats.count("blackhole")
                    await self._unblocked.wait()
                f, r = self._faults, self._rng
                if f.delay and r.random() < f.delay:
                    self.stats.count("delay")
                    await asyncio.sleep(f.delay_s * r.uniform(0.5, 1.5))
                roll = r.random()
                if roll < f.reset + f.truncate:
                    cut = r.randrange(len(chunk))
                    writer.write(chunk[:cut])
                    await writer.drain()
                    if roll < f.reset:
                        self.stats.count("reset")
                        writer.transport.abort()  # RST, not FIN
                    else:
                        self.stats.count("truncate")
                        writer.close()
                    return
                if roll < f.reset + f.truncate + f.corrupt:
                    self.stats.count("corrupt")
                    b = bytearray(chunk)
                    # inverting a byte makes JSON text invalid UTF-8 and breaks CRC-covered data: a
                    # malformed answer. A single bit flip can turn a digit into another digit, which
                    # no receiver can detect (TCP and TLS checksums are what stop that).
                    b[r.randrange(len(b))] ^= 0xFF
                    chunk = bytes(b)
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            return
