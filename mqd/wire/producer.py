"""A small async producer: routes each partition to its group's master, the way RocketMQ's does.

Routing comes from ``GET /v1/metadata`` (any node answers the whole layout). A produce goes to the
partition's master; a ``421 not_master`` or a connection failure refreshes the metadata and retries
within a short, bounded budget, after which the caller gets ``BrokerError(code="master_unavailable",
retriable=True)``. Like RocketMQ's ``retryTimesWhenSendFailed`` (and Kafka without idempotence), a
retry after a request whose outcome is unknown (the connection broke mid-answer) can write the batch
twice: delivery from a producer is at least once. Errors that a retry cannot fix (malformed batch,
unknown partition, too large) are raised at once with ``retriable=False``. A record above
``max_record_bytes`` (the broker's limit, mqd/record_size.py) is refused before sending, with the
broker's own error code ``record_too_large``.

``synthetic_values`` and ``TokenBucket`` make load for ``mqd produce`` (mqd/operator/produce_command.py),
the benchmark and the demo.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mqd import record_size
from mqd.topic_name import check_topic_name
from mqd.topic_partition import TopicPartition
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError, ProduceResult
from mqd.wire.metadata import ClusterMetadata, MetadataError

__all__ = [
    "BrokerError",
    "ProduceResult",
    "Producer",
    "TokenBucket",
    "key_partition",
    "synthetic_values",
]

_ACKS = ("master", "all")
_BACKOFF_START = 0.05
_BACKOFF_MAX = 0.5
# Keep one produce request well under the broker's default max_request_bytes (64 MiB).
_MAX_REQUEST_BYTES = 16 * 1024 * 1024


def key_partition(key: bytes, partitions: int) -> int:
    """The partition a key maps to: ``zlib.crc32(key) % partitions`` (stable across processes)."""
    if partitions <= 0:
        raise ValueError("partitions must be positive")
    return zlib.crc32(key) % partitions


def _parse_metadata(raw: Any) -> ClusterMetadata:
    try:
        return ClusterMetadata.parse(raw)
    except MetadataError as exc:
        raise BrokerError(str(exc), code="bad_metadata") from exc


class TokenBucket:
    """Rate limiter in records per second; ``burst`` tokens may be spent at once.

    A request for more tokens than are available is granted and puts the bucket in debt, and the
    caller waits until the debt is paid back: large batches keep the long-run rate exact.
    """

    def __init__(self, rate: float, burst: float | None = None, *, now: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else self.rate / 10
        if self.burst <= 0:
            raise ValueError("burst must be positive")
        self._tokens = self.burst
        self._stamp = time.monotonic() if now is None else now

    def reserve(self, n: float, now: float) -> float:
        """Take ``n`` tokens at time ``now``; returns how long to wait before using them."""
        if n < 0:
            raise ValueError("cannot reserve a negative number of tokens")
        elapsed = max(0.0, now - self._stamp)
        self._stamp = max(self._stamp, now)
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate) - n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self, n: float) -> None:
        delay = self.reserve(n, time.monotonic())
        if delay > 0:
            await asyncio.sleep(delay)


class Producer:
    """Async producer for one mqd cluster.

    ``bootstrap`` is one URL, a comma-separated list or a list of node URLs; any live node serves
    the metadata. ``retry_timeout`` bounds how long a produce keeps retrying a master that does not
    answer before it reports ``master_unavailable``.

    ``acks = "all"`` (the default, as Kafka's since 3.0) answers once every live slave of the group
    holds the batch: it survives the loss of the master's disk. ``acks = "master"`` answers once the
    master wrote it, before any slave has it (and before an fsync, unless the master runs with
    ``fsync = "always"``): a master that crashes or loses its disk before a slave copied the batch
    loses it although the producer saw it acknowledged.
    """

    def __init__(
        self,
        bootstrap: list[str] | str,
        *,
        acks: str = "all",
        token: str | None = None,
        request_timeout: float = 30.0,
        retry_timeout: float = 3.0,
        client: BrokerClient | None = None,
        max_record_bytes: int = record_size.DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        urls = (
            [u.strip().rstrip("/") for u in bootstrap.split(",")]
            if isinstance(bootstrap, str)
            else [u.strip().rstrip("/") for u in bootstrap]
        )
        urls = [u for u in urls if u]
        if not urls:
            raise ValueError("bootstrap needs at least one broker URL")
        for u in urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"bootstrap URL {u!r} must start with http:// or https://")
        if acks not in _ACKS:
            raise ValueError(f"acks must be one of {_ACKS}, got {acks!r}")
        if retry_timeout < 0:
            raise ValueError("retry_timeout must be >= 0")
        self._bootstrap = urls
        self._acks = acks
        self._retry_timeout = retry_timeout
        self._max_record_bytes = max_record_bytes
        self._own_client = client is None
        self._client = client or BrokerClient(request_timeout=request_timeout, auth_token=token)
        self._meta: ClusterMetadata | None = None
        self._meta_version = 0
        self._meta_lock = asyncio.Lock()
        self._rr: dict[str, int] = {}
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        await self._client.start()
        self._started = True
        try:
            await self.refresh_metadata()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._own_client:
            await self._client.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- metadata ------------------------------------------------------------------------------

    async def refresh_metadata(self) -> None:
        """Reload the layout from the first node that answers (bootstrap first, then known nodes)."""
        seen = self._meta_version
        async with self._meta_lock:
            if self._meta_version != seen:
                return  # another task refreshed while this one waited
            candidates = list(self._bootstrap)
            if self._meta is not None:
                candidates += [n.url for n in self._meta.nodes.values() if n.url not in candidates]
            last: BrokerError | None = None
            for url in candidates:
                try:
                    raw = await self._client.metadata(url)
                except BrokerError as exc:
                    if not exc.retriable:
                        raise
                    last = exc
                    continue
                self._meta = _parse_metadata(raw)
                self._meta_version += 1
                return
            raise BrokerError(
                f"no broker answered the metadata request (tried {', '.join(candidates)}): {last}",
                code="no_broker_available",
                retriable=True,
            )

    def partitions_for(self, topic: str) -> int:
        """Number of partitions of ``topic`` (from the last metadata)."""
        check_topic_name(topic)
        meta = self._require_meta()
        if topic not in meta.topics:
            raise BrokerError(f"unknown topic {topic!r}", status=404, code="unknown_topic", retriable=False)
        return len(meta.topics[topic])

    def topics(self) -> dict[str, int]:
        meta = self._require_meta()
        return {name: len(parts) for name, parts in meta.topics.items()}

    def _require_meta(self) -> ClusterMetadata:
        if self._meta is None:
            raise RuntimeError("Producer.start() was not called")
        return self._meta

    async def _check_partition(self, topic: str, partition: int) -> None:
        check_topic_name(topic)  # InvalidTopicName before any request is sent
        meta = self._require_meta()
        if topic not in meta.topics:
            await self.refresh_metadata()  # a topic may have been added to the layout since
            meta = self._require_meta()
        n = self.partitions_for(topic)
        if not 0 <= partition < n:
            raise BrokerError(
                f"{topic}/{partition}: no such partition (topic has {n})",
                status=404,
                code="unknown_partition",
                retriable=False,
            )

    # -- sending -------------------------------------------------------------------------------

    async def send_encoded(self, topic: str, partition: int, batches: bytes) -> ProduceResult:
        """Produce already encoded batches (``format.encode_batch`` output, concatenated)."""
        if not self._started:
            raise RuntimeError("Producer.start() was not called")
        if len(batches) > self._max_record_bytes:  # else no record in it can be over the limit
            try:
                fmt.check_record_sizes(batches, fmt.validate(batches), self._max_record_bytes)
            except record_size.RecordTooLarge as exc:
                raise BrokerError(
                    f"{topic}/{partition}: {exc}", status=413, code="record_too_large", retriable=False
                ) from None
        await self._check_partition(topic, partition)
        deadline = time.monotonic() + self._retry_timeout
        backoff = _BACKOFF_START
        last: BrokerError | None = None
        while True:
            url, alive = self._require_meta().master_url(TopicPartition(topic, partition))
            try:
                return await self._client.produce(url, topic, partition, batches, acks=self._acks)
            except BrokerError as exc:
                if not _worth_retrying(exc):
                    raise
                last = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"{topic}/{partition}: master unavailable ({url}"
                    f"{'' if alive else ', reported down by the cluster'}); "
                    f"gave up after {self._retry_timeout:.1f}s: {last}",
                    status=503,
                    code="master_unavailable",
                    retriable=True,
                ) from last
            await asyncio.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, _BACKOFF_MAX)
            try:
                await self.refresh_metadata()
            except BrokerError as exc:
                if not exc.retriable:
                    raise
                last = exc

    async def send_batch(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes] | pa.Array,
        keys: Sequence[bytes | None] | pa.Array | None = None,
        timestamps: Sequence[int] | np.ndarray | None = None,
        headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
    ) -> ProduceResult:
        """Produce one batch of records to one partition. Timestamps are epoch ms (default: now)."""
        batch = fmt.encode_batch(values, keys=keys, timestamps=timestamps, headers=headers)
        return await self.send_encoded(topic, partition, batch)

    async def send(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
    ) -> list[ProduceResult]:
        """Produce records, choosing partitions: by ``crc32(key) % n`` for keyed records, else the
        whole call goes to the next partition in round-robin order. One request per partition used.
        """
        if len(values) == 0:
            return []
        if not self._started:
            raise RuntimeError("Producer.start() was not called")
        await self._check_partition(topic, 0)
        n = self.partitions_for(topic)
        if keys is None:
            return [await self.send_batch(topic, self._next_partition(topic, n), values)]
        if len(keys) != len(values):
            raise fmt.BatchError("keys and values differ in length")
        # Records without a key share one round-robin partition for this call.
        rr = self._next_partition(topic, n)
        parts = np.fromiter(
            (rr if k is None else zlib.crc32(k) % n for k in keys), dtype=np.int64, count=len(keys)
        )
        order = np.argsort(parts, kind="stable")  # keeps per-key order within a partition
        bounds = np.flatnonzero(np.diff(parts[order])) + 1
        tasks = []
        for idx in np.split(order, bounds):
            p = int(parts[idx[0]])
            tasks.append(self.send_batch(topic, p, [values[i] for i in idx], keys=[keys[i] for i in idx]))
        return list(await asyncio.gather(*tasks))

    async def produce_table(
        self,
        topic: str,
        partition: int,
        data: pa.Table | pa.RecordBatch | pa.Array | pa.ChunkedArray,
        *,
        batch_records: int = 10_000,
    ) -> list[ProduceResult]:
        """Vectorised produce of many records to one partition.

        ``data`` is an array of values, or a table with a ``value`` column and optional ``key``
        (binary) and ``timestamp`` (timestamp or int64 ms) columns. Records are cut into batches of
        ``batch_records`` and sent in requests of up to 16 MiB, in order; one result per request.
        """
        if batch_records <= 0:
            raise ValueError("batch_records must be positive")
        keys: pa.Array | None = None
        ts: np.ndarray | None = None
        if isinstance(data, pa.Table | pa.RecordBatch):
            names = set(data.schema.names)
            if "value" not in names:
                raise fmt.BatchError(f"produce_table needs a 'value' column, got {sorted(names)}")
            unknown = names - {"value", "key", "timestamp"}
            if unknown:
                raise fmt.BatchError(f"produce_table: unexpected columns {sorted(unknown)}")
            values = _one_array(data.column("value"))
            if "key" in names:
                keys = _one_array(data.column("key"))
            if "timestamp" in names:
                ts = _timestamps_ms(_one_array(data.column("timestamp")))
        else:
            values = _one_array(data)
        total = len(values)
        if total == 0:
            return []
        results: list[ProduceResult] = []
        pending: list[bytes] = []
        pending_bytes = 0
        for start in range(0, total, batch_records):
            stop = min(start + batch_records, total)
            batch = fmt.encode_batch(
                values.slice(start, stop - start),
                keys=keys.slice(start, stop - start) if keys is not None else None,
                timestamps=ts[start:stop] if ts is not None else None,
            )
            if pending and pending_bytes + len(batch) > _MAX_REQUEST_BYTES:
                results.append(await self.send_encoded(topic, partition, b"".join(pending)))
                pending, pending_bytes = [], 0
            pending.append(batch)
            pending_bytes += len(batch)
        results.append(await self.send_encoded(topic, partition, b"".join(pending)))
        return results

    def _next_partition(self, topic: str, n: int) -> int:
        p = self._rr.get(topic, 0) % n
        self._rr[topic] = p + 1
        return p


def _worth_retrying(exc: BrokerError) -> bool:
    """Retry what a new route or a moment may fix: transport failures, 421, 429, 503.

    Other 5xx answers (e.g. 504 replication_timeout with acks=all) mean the records were written:
    a retry would duplicate them for sure, so the caller decides.
    """
    if exc.status is None:
        return exc.retriable
    return exc.status in (421, 429, 503)


def _one_array(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _timestamps_ms(col: pa.Array) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", tz=col.type.tz)).cast(pa.int64())
    elif not pa.types.is_integer(col.type):
        raise fmt.BatchError(f"timestamp column must be a timestamp or int64 ms, got {col.type}")
    if col.null_count:
        raise fmt.BatchError("timestamp column has nulls")
    return np.asarray(col.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# synthetic load (mqd produce, the benchmark, the demo)


def synthetic_values(count: int, size: int, rng: np.random.Generator | int | None = None) -> pa.Array:
    """``count`` values of ``size`` random bytes as one binary array, built without per-record objects.

    Random bytes, so Parquet cannot shrink them by dictionary or compression tricks.
    """
    if count < 0 or size < 0:
        raise ValueError("count and size must be >= 0")
    if count * size > 2**31 - 1:
        raise ValueError("synthetic block exceeds 2 GiB; produce in chunks")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    data = gen.integers(0, 256, size=count * size, dtype=np.uint8).tobytes()
    offsets = (np.arange(count + 1, dtype=np.int64) * size).astype(np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), count, buffers)
