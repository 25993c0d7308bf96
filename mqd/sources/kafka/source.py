"""KafkaSource: a Kafka-protocol cluster (Apache Kafka, Redpanda, Tansu) behind the engine's seam.

aiokafka's AIOKafkaClient does what a well-kept library should: bootstrap, one connection per
broker, API-version negotiation per connection, TLS, SASL PLAIN/SCRAM, framing and the protocol
structs. mqd keeps its own fetch scheduling (the engine's NodeFetcher: one Fetch per leader node for
all its fetchable partitions, one in flight) and decodes the records itself (record_batch).

Fetch answers map onto the engine's statuses (fetch_errors.py, a pure table):
- records: FOUND; none: CAUGHT_UP (the broker long-polled; the next round asks again);
- OFFSET_OUT_OF_RANGE: Kafka names no valid offset, so ListOffsets (earliest, latest) on the same
  node turns it into OFFSET_TOO_SMALL (next: the log start) or OFFSET_OVERFLOW_BADLY (next: the log
  end), which on_offset_reset then follows exactly as for the mqd broker;
- routing errors (NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION,
  LEADER_NOT_AVAILABLE, ...) and any other partition error: NOT_SERVED, so the engine refreshes the
  metadata and re-routes that partition only;
- a failed request (connection, timeout): SourceError with node_down, so the node backs off.
Follower fetching (KIP-392, read_replica): ``consumer.kafka.client_rack`` goes out as Fetch's
rack_id; a leader's preferred read replica is leased for metadata_refresh_interval and passed on as
the suggested node; a replica's answers suggest the leader again once the lease is over, and its
errors end the lease (OFFSET_OUT_OF_RANGE from a replica goes back to the leader, never a reset;
a position beyond a replica's high watermark is that replica lagging, not a truncated log).
Epoch checks (OffsetsForLeaderEpoch) go to the leader, the only broker that answers a consumer's.

Incarnations (log_incarnation has the rule and the string): the topic id from Metadata v10+
(protocol_ext) and truncations found with OffsetsForLeaderEpoch. A request naming another
incarnation than the partition's current one is answered INCARNATION_CHANGED without fetching. The
epoch of a position is checked (OffsetsForLeaderEpoch of that epoch on the node, before the Fetch)
after a higher leader epoch in Metadata, a FENCED/UNKNOWN_LEADER_EPOCH answer, and before an
offset beyond the log end is reported as such (a truncated log looks exactly like that): an end
offset below the position is a truncation (INCARNATION_CHANGED, ``diverged_at`` = that end offset),
one at or above it is a leader change only. Before an out-of-range or unknown-topic answer is passed
on, the metadata is read again: a new topic id makes it INCARNATION_CHANGED with ``diverged_at`` 0.
A broker without OffsetsForLeaderEpoch (Tansu) gets no separate truncation check, said once in the log.

Fetch v12+ carries the epoch of the record before each position (KIP-320 in the fetch path): an
answer's diverging_epoch is judged by the same rule at once. v13 names topics by id where every topic
of the request has one (Tansu 0.6 advertises up to v17, so it gets v13): a recreated topic answers
UNKNOWN_TOPIC_ID / INCONSISTENT_TOPIC_ID and is rechecked as above before any record of the new log
is read under the old id. Decoded batches carry the leader epoch of their last record, which the
landing keeps (FileRange.leader_epoch); after a restart the request's ``landed`` (the head's record
and epoch) gives the position its epoch, so a log truncated while no daemon ran is found before
anything after the landed end is fetched.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    IncompatibleBrokerVersion,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.offset import OffsetRequest

from mqd.backoff import Backoff
from mqd.config import ConsumerConfig
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import (
    Cluster,
    ConsumerGroup,
    Decoded,
    FetchRequest,
    FetchResult,
    FetchStatus,
    GroupSettings,
    PartitionResult,
    SourceError,
)
from mqd.lazy_import import lazy_import
from mqd.sources.kafka.consumer_group_protocol import ConsumerProtocolGroup, ConsumerProtocolOffsetStore
from mqd.sources.kafka.fetch_answer import MalformedAnswer, parsed_fetch
from mqd.sources.kafka.fetch_errors import FetchOutcome, error_name, fetch_outcome, out_of_range_outcome
from mqd.sources.kafka.fetch_session import SESSION_ERRORS, FetchSession, SessionRequest
from mqd.sources.kafka.frame_reader import FrameClient
from mqd.sources.kafka.group import KafkaGroup, KafkaOffsetStore
from mqd.sources.kafka.log_incarnation import LogIncarnations, epoch_before
from mqd.sources.kafka.metadata import NO_LEADER, KafkaMetadata
from mqd.sources.kafka.protocol_ext import (
    FetchedPartition,
    OffsetsForLeaderEpochRequest,
    epoch_end_offsets,
    fetched_partitions,
)
from mqd.sources.kafka.protocol_ext import FetchRequest as KafkaFetchRequest
from mqd.sources.kafka.read_replica import ReadReplicas
from mqd.topic_partition import TopicPartition

if TYPE_CHECKING:
    from mqd.sources.kafka import record_batch
else:  # numpy and pyarrow: imported at the first answer, after the first fetch is out (issue 34)
    record_batch = lazy_import("mqd.sources.kafka.record_batch")

log = structlog.get_logger("mqd.sources.kafka")

EARLIEST, LATEST = -2, -1
READ_COMMITTED = 1
_HEAD_BYTES = 64  # what the budget charges per answer besides the records
# a broker's answers to a login that a retry with the same settings gets again
_LOGIN_REFUSED = (SaslAuthenticationFailed, AuthenticationFailedError, UnsupportedSaslMechanismError)


def _no_data(_start: int, _check_crc: bool) -> Decoded:
    return Decoded([])


def _decode(
    records: bytes | memoryview,
    start: int,
    check_crc: bool,
    *,
    tp: TopicPartition,
    aborted: list[record_batch.AbortedTxn] | None,
    epochs: list[tuple[int, int]],
    broker: str,
) -> Decoded:
    """decode_partition, each batch stamped with the leader epoch of its last record (the landing
    keeps it so a restart can validate the landed position, KIP-320). Never raises: an exception
    would reach the fetcher's catch-all, which drops the node's whole answer and fetches the same
    bytes again at once, while an error here parks this partition with backoff."""
    try:
        decoded = record_batch.decode_partition(
            records, start, check_crc, tp=tp, aborted=aborted, broker=broker
        )
    except Exception as exc:  # a decoder bug: the fuzz tests find none, the traceback says where
        log.exception("kafka record decoding failed", topic=tp.topic, partition=tp.partition, broker=broker)
        return Decoded([], f"{tp}: record batches at offset {start} from {broker}: decoder failed: {exc!r}")
    if not epochs:
        return decoded
    batches = [replace(d, leader_epoch=epoch_before(epochs, d.next_offset)) for d in decoded.batches]
    return Decoded(batches, decoded.error, decoded.held)


def _changed(tp: TopicPartition, incarnation: str | None, diverged_at: int, why: str) -> PartitionResult:
    return PartitionResult(
        tp, FetchStatus.INCARNATION_CHANGED, diverged_at, 0, 0, None, incarnation, why, _no_data, diverged_at
    )


class _Settled(NamedTuple):
    """What :meth:`KafkaSource._before_fetch` settles before a Fetch."""

    early: list[PartitionResult]  # answered without fetching
    current: dict[TopicPartition, str | None]  # each partition's incarnation
    topic_ids: dict[TopicPartition, str | None]
    fetchable: list[FetchRequest]


class KafkaSource:
    """The Kafka cluster named by ``config.bootstrap`` (mqd.consumer.source.Source)."""

    # a Kafka broker answers a connection's requests in order: a cancelled long poll would still
    # hold the next fetch back, and its fetch session's epoch would be spent
    cuts_long_polls = False

    def __init__(self, config: ConsumerConfig) -> None:
        self._config = config
        kc = config.kafka
        self.client_id = kc.client_id or config.effective_client_id
        self.read_committed = kc.isolation_level == "read_committed"
        self._client: AIOKafkaClient | None = None
        self._ssl: ssl.SSLContext | None = None
        self.metadata: KafkaMetadata | None = None
        self._listeners: list[Callable[[Cluster], None]] = []
        self._rotation = 0  # rotates the partition order inside every request
        self.incarnations = LogIncarnations()
        self.sessions: dict[str, FetchSession] = {}  # node id -> its incremental fetch session
        self.epoch_checks = 0  # OffsetsForLeaderEpoch requests sent
        self.fetch_version: int | None = None  # of the last Fetch answer (status, tests)
        self._epoch_checks_supported = True
        self.read_replicas = ReadReplicas(config.metadata_refresh_interval)
        # record bytes each node served per partition: where reads went (status, tests)
        self.served_bytes: dict[tuple[str, TopicPartition], int] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    def _make_client(self) -> AIOKafkaClient:
        cfg, kc = self._config, self._config.kafka
        context = None
        if kc.security_protocol in ("SSL", "SASL_SSL"):
            context = create_ssl_context(
                cafile=kc.tls_ca_file, certfile=kc.tls_cert_file, keyfile=kc.tls_key_file
            )
            context.check_hostname = kc.tls_check_hostname
        self._ssl = context
        return FrameClient(
            bootstrap_servers=list(cfg.bootstrap),
            client_id=self.client_id,
            # a fetch long-polls for fetch_max_wait_ms before its answer is even sent
            request_timeout_ms=int(cfg.request_timeout * 1000) + cfg.fetch_max_wait_ms,
            retry_backoff_ms=cfg.error_backoff_ms,
            metadata_max_age_ms=int(cfg.metadata_refresh_interval * 1000),
            security_protocol=kc.security_protocol,
            ssl_context=context,
            sasl_mechanism=kc.sasl_mechanism,
            sasl_plain_username=kc.sasl_username,
            sasl_plain_password=kc.sasl_password,
        )

    async def start(self, timeout: float) -> None:
        if self._client is not None:
            return
        cfg = self._config
        self._client = client = self._make_client()
        deadline = time.monotonic() + timeout
        backoff = Backoff(cfg.error_backoff_ms / 1000, 2.0)
        while True:  # retried until ``timeout``, as the seam says (a broker restarting comes back)
            try:
                await client.bootstrap()
                break
            except (KafkaError, OSError) as exc:
                refused = await self._login_refused(client)
                if refused is not None:  # waiting does not mend a password or a certificate
                    await self.stop()
                    raise refused from exc
                delay = backoff.next()
                if time.monotonic() + delay > deadline:
                    await self.stop()
                    raise ConsumerError(
                        f"cannot reach any Kafka bootstrap server {cfg.bootstrap}: {exc}", retriable=True
                    ) from exc
                await asyncio.sleep(delay)
        self.metadata = KafkaMetadata(
            client,
            refresh_interval=cfg.metadata_refresh_interval,
            error_backoff=cfg.error_backoff_ms / 1000,
            request_timeout=min(cfg.request_timeout, 5.0),
        )
        self.metadata.add_listener(self._on_metadata)
        for fn in self._listeners:
            self.metadata.add_listener(fn)
        await self.metadata.start(timeout=timeout)

    async def _login_refused(self, client: AIOKafkaClient) -> ConsumerError | None:
        """After a failed bootstrap of a secured source: a non-retriable error when a bootstrap
        server refused the login or its certificate failed verification. aiokafka's bootstrap only
        logs each server's reason and raises "Unable to bootstrap", so one more connection asks."""
        kc = self._config.kafka
        if kc.security_protocol == "PLAINTEXT":
            return None
        for host, port, _family in client.hosts:
            try:
                conn = await create_conn(
                    host,
                    port,
                    client_id=self.client_id,
                    request_timeout_ms=int(self._config.request_timeout * 1000),
                    ssl_context=self._ssl,
                    security_protocol=kc.security_protocol,
                    sasl_mechanism=kc.sasl_mechanism,
                    sasl_plain_username=kc.sasl_username,
                    sasl_plain_password=kc.sasl_password,
                )
            except ssl.SSLCertVerificationError as exc:
                ca = kc.tls_ca_file or "the system's CA store"
                return ConsumerError(
                    f"TLS certificate verification of Kafka broker {host}:{port} failed: {exc}"
                    f" (tls_ca_file: {ca}, tls_check_hostname: {str(kc.tls_check_hostname).lower()})"
                )
            except _LOGIN_REFUSED as exc:
                return ConsumerError(
                    f"SASL authentication failed at Kafka broker {host}:{port} for user"
                    f" {kc.sasl_username!r} with {kc.sasl_mechanism} over {kc.security_protocol}: {exc}"
                )
            except (TimeoutError, KafkaError, OSError):
                continue  # down or restarting: the bootstrap is retried as before
            conn.close()
        return None

    async def stop(self) -> None:
        metadata, self.metadata = self.metadata, None
        if metadata is not None:
            await metadata.stop()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        self.sessions.clear()  # a new client starts new sessions

    # -- metadata --------------------------------------------------------------------------------

    @property
    def cluster(self) -> Cluster | None:
        return None if self.metadata is None else self.metadata.current

    @property
    def metadata_error(self) -> str | None:
        return None if self.metadata is None else self.metadata.last_error

    def add_metadata_listener(self, fn: Callable[[Cluster], None]) -> None:
        self._listeners.append(fn)
        if self.metadata is not None:
            self.metadata.add_listener(fn)

    def request_refresh(self) -> None:
        if self.metadata is not None:
            self.metadata.request_refresh()

    def _on_metadata(self, cluster: Cluster) -> None:
        if self.metadata is not None:
            self.incarnations.leader_epochs(self.metadata.leader_epochs)
        self.read_replicas.forget(cluster.partitions)

    def _leader(self, tp: TopicPartition) -> str | None:
        """``tp``'s leader as our metadata has it (None: unknown, or no leader right now)."""
        cluster = self.cluster
        route = None if cluster is None else cluster.partitions.get(tp)
        return None if route is None or route.leader == NO_LEADER else route.leader

    def _topic_id(self, topic: str) -> str | None:
        return None if self.metadata is None else self.metadata.topic_ids.get(topic)

    # -- fetch -----------------------------------------------------------------------------------

    def _ordered(self, requests: list[FetchRequest]) -> list[tuple[str, list[tuple[int, int, int]]]]:
        """Requests grouped by topic, topics and partitions rotated one step per request: a broker
        that fills its answer partition by partition cannot starve the same last ones every time."""
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for r in requests:
            by_topic.setdefault(r.tp.topic, []).append((r.tp.partition, r.offset, r.max_bytes))
        k = self._rotation
        self._rotation += 1
        topics = list(by_topic.items())
        if topics:
            i = k % len(topics)
            topics = topics[i:] + topics[:i]
        out = []
        for topic, parts in topics:
            j = k % len(parts)
            out.append((topic, parts[j:] + parts[:j]))
        return out

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Coroutine[Any, Any, FetchResult]:
        if self._client is None:
            raise SourceError("kafka source not started", kind="metadata", node_down=False)
        return self._fetch(node_id, requests, max_wait_ms, min_bytes, max_bytes)

    async def _fetch(
        self, node_id: str, requests: list[FetchRequest], max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> FetchResult:
        assert self._client is not None
        early, current, topic_ids, fetchable = await self._before_fetch(node_id, requests)
        if not fetchable:
            return FetchResult(early, body=None, nbytes=_HEAD_BYTES)
        offsets = {r.tp: r.offset for r in fetchable}
        # KIP-320 in the fetch path (v12+): the epoch of the record before each position
        epoch_at = self.incarnations.epoch_at
        last_epochs = {r.tp: e for r in fetchable if (e := epoch_at(r.tp, r.offset)) is not None}
        ids = {r.tp.topic: i for r in fetchable if (i := topic_ids[r.tp]) is not None}
        try:
            resp, session, sreq = await self._send_fetch(
                node_id, fetchable, max_wait_ms, min_bytes, max_bytes, last_epochs, ids
            )
        except SourceError as exc:
            for r in fetchable:  # the engine routes them elsewhere; a replica's lease ends here
                if (leader := self._leader(r.tp)) is not None and leader != node_id:
                    self.read_replicas.failed(r.tp, node_id, leader, str(exc))
            raise
        names = {i: t for t, i in ids.items()}
        results: list[PartitionResult] = early
        out_of_range: list[TopicPartition] = []
        suspect: dict[TopicPartition, int] = {}  # answers a truncated or recreated log also gives
        answered: set[TopicPartition] = set()
        nbytes = _HEAD_BYTES
        broker = self._broker_name(node_id)
        served = self.served_bytes
        for part in fetched_partitions(resp, names):
            if part.topic is None:
                log.warning("kafka fetch answer: unknown topic id", node=node_id, topic_id=part.topic_id)
                continue
            tp = TopicPartition(part.topic, part.partition)
            error_code, records, offset = part.error_code, part.records, offsets.get(tp, -1)
            nbytes += len(records or b"")
            answered.add(tp)
            if records:
                served[node_id, tp] = served.get((node_id, tp), 0) + len(records)
            leader = self._leader(tp)
            on_replica = leader is not None and leader != node_id  # KIP-392: a follower serves
            if on_replica and error_code:
                assert leader is not None
                self.read_replicas.failed(tp, node_id, leader, error_name(error_code))
            if error_code == 0:
                session.bounds(tp, part.highwater, part.last_stable, part.log_start)
                if part.diverging is not None and tp in offsets:
                    changed = self._diverged(node_id, tp, offset, last_epochs.get(tp), *part.diverging)
                    if changed is not None:
                        results.append(changed)
                        continue
            transitions, found_end = (
                record_batch.batch_heads(records) if records and not error_code else ([], None)
            )
            outcome = fetch_outcome(
                error_code,
                offset=offset,
                highwater=part.highwater,
                log_start=part.log_start,
                records=bool(records),
                found_end=found_end,
                on_replica=on_replica,
                node_id=node_id,
            )
            if outcome.check_epoch:
                self.incarnations.pending.add(tp)  # a leader change: check the epoch first
            if outcome.recheck:
                suspect[tp] = offset
            if outcome.status is None:
                out_of_range.append(tp)  # the bounds are looked up below
                continue
            results.append(self._answer(node_id, broker, tp, part, leader, outcome, transitions, current[tp]))
        results.extend(self._omitted(node_id, session, sreq, answered, offsets, current))
        replaced = await self._recheck(node_id, suspect, topic_ids) if suspect else {}
        if replaced:
            results = [replaced.get(r.tp, r) for r in results]
            out_of_range = [tp for tp in out_of_range if tp not in replaced]
        if out_of_range:
            bounds = await self._out_of_range(node_id, out_of_range, offsets)
            results.extend(replace(r, incarnation=current[r.tp]) for r in bounds)
        results.extend(r for tp, r in replaced.items() if tp in offsets and tp not in {x.tp for x in results})
        # the answer's own buffer where it was read in place: the records are views of it
        return FetchResult(results, body=getattr(resp, "body", resp), nbytes=nbytes)

    def _answer(
        self,
        node_id: str,
        broker: str,
        tp: TopicPartition,
        part: FetchedPartition,
        leader: str | None,
        outcome: FetchOutcome,
        transitions: list[tuple[int, int]],
        incarnation: str | None,
    ) -> PartitionResult:
        """The engine's result for partition answer ``part`` from ``node_id`` once the table
        (fetch_errors.py) gave its ``outcome``: the records' decoder, the node to fetch from next."""
        assert outcome.status is not None
        records = part.records
        on_replica = leader is not None and leader != node_id
        decode = _no_data
        if outcome.status is FetchStatus.FOUND and records:
            aborted = None
            if self.read_committed:
                aborted = [record_batch.AbortedTxn(pid, first) for pid, first in part.aborted]
            decode = functools.partial(
                _decode, records, tp=tp, aborted=aborted, epochs=transitions, broker=broker
            )
            if incarnation is not None:
                self.incarnations.saw_batches(tp, transitions, outcome.next_offset)
        suggested = None
        if on_replica:
            if not part.error_code:
                assert leader is not None
                suggested = self.read_replicas.answered(tp, node_id, leader)
        elif part.preferred_replica >= 0 and leader is not None:
            cluster = self.cluster
            live = {} if cluster is None else cluster.nodes
            suggested = self.read_replicas.named(tp, str(part.preferred_replica), leader, live)
        end = part.last_stable if self.read_committed and part.last_stable >= 0 else part.highwater
        return PartitionResult(
            tp=tp,
            status=outcome.status,
            next_offset=outcome.next_offset,
            log_start=max(part.log_start, 0) if outcome.bounds else 0,
            log_end=max(end, 0) if outcome.bounds else 0,
            suggested_node=suggested,
            incarnation=incarnation,
            error=outcome.error,
            decode=decode,
        )

    async def _before_fetch(self, node_id: str, requests: list[FetchRequest]) -> _Settled:
        """What is settled before a Fetch: the results of requests answered without fetching (the
        topic recreated; a leader epoch check that found a truncation or could not be made), each
        partition's current incarnation and topic id, and the requests to fetch."""
        early: list[PartitionResult] = []
        current: dict[TopicPartition, str | None] = {}
        topic_ids: dict[TopicPartition, str | None] = {}
        fetchable: list[FetchRequest] = []
        for r in requests:
            topic_ids[r.tp] = topic_id = self._topic_id(r.tp.topic)
            inc, diverged = self.incarnations.check(r.tp, r.incarnation, topic_id)
            current[r.tp] = inc
            if diverged is not None:
                early.append(_changed(r.tp, inc, diverged, "the topic was recreated (new topic id)"))
                continue
            if r.landed is not None and self.incarnations.landed(r.tp, r.offset, r.incarnation, r.landed):
                log.info(
                    "kafka landed position to validate against the log",
                    topic=r.tp.topic,
                    partition=r.tp.partition,
                    landed_offset=r.landed.offset,
                    leader_epoch=r.landed.leader_epoch,
                    incarnation=inc,
                )
            fetchable.append(r)
        pending = {r.tp: r.offset for r in fetchable if r.tp in self.incarnations.pending}
        if pending:
            checked = await self._check_epochs(node_id, pending)
            early.extend(checked.values())
            fetchable = [r for r in fetchable if r.tp not in checked]
        return _Settled(early, current, topic_ids, fetchable)

    def _omitted(
        self,
        node_id: str,
        session: FetchSession,
        sreq: SessionRequest,
        answered: set[TopicPartition],
        offsets: dict[TopicPartition, int],
        current: dict[TopicPartition, str | None],
    ) -> list[PartitionResult]:
        """The partitions an incremental answer left out (nothing new): caught up, with the bounds
        as last seen; an idle partition on a replica goes back to the leader when its lease ends."""
        out = []
        for tp, (highwater, lso, log_start) in session.omitted(sreq, answered).items():
            end = lso if self.read_committed and lso >= 0 else highwater
            leader = self._leader(tp)
            back = None
            if leader is not None and leader != node_id:
                back = self.read_replicas.answered(tp, node_id, leader)
            out.append(
                PartitionResult(tp, FetchStatus.CAUGHT_UP, offsets[tp], max(log_start, 0), max(end, 0),
                                back, current[tp], None, _no_data)
            )  # fmt: skip
        return out

    async def _send_fetch(
        self,
        node_id: str,
        fetchable: list[FetchRequest],
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        last_epochs: dict[TopicPartition, int],
        topic_ids: dict[str, str],
    ) -> tuple[Any, FetchSession, SessionRequest]:
        """One Fetch within the node's fetch session; a session error resets it and the request is
        sent again, full (once). v13 names the topics by ``topic_ids`` where every topic has one."""
        assert self._client is not None
        session = self.sessions.get(node_id)
        if session is None:
            session = self.sessions[node_id] = FetchSession(self._config.kafka.fetch_sessions)
        epochs = {} if self.metadata is None else self.metadata.leader_epochs
        by_tp = {r.tp: r for r in fetchable}
        for attempt in (1, 2):
            sreq = session.request({r.tp: (r.offset, r.max_bytes, epochs.get(r.tp, -1)) for r in fetchable})
            forgotten: dict[str, list[int]] = {}
            for tp in sreq.forgotten:
                forgotten.setdefault(tp.topic, []).append(tp.partition)
            request = KafkaFetchRequest(
                # Tansu answers a fetch with max_wait 0 without any partition; 1 ms costs nothing
                max_wait_time=max(max_wait_ms, 1),
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                isolation_level=READ_COMMITTED if self.read_committed else 0,
                topics=self._ordered([by_tp[tp] for tp in sreq.send]),
                leader_epochs=epochs,
                session_id=sreq.session_id,
                session_epoch=sreq.epoch,
                forgotten=list(forgotten.items()),
                last_epochs=last_epochs,
                topic_ids={**self._forgotten_ids(forgotten), **topic_ids},
                rack_id=self._config.kafka.client_rack,
            )
            try:
                resp = await self._client.send(int(node_id), request)
            except (KafkaError, OSError) as exc:
                session.reset()
                raise SourceError(f"{node_id}: {exc!r}", kind="transport", node_down=True) from exc
            try:
                resp = parsed_fetch(resp)
            except MalformedAnswer as exc:
                session.reset()
                version = getattr(resp, "version", "?")
                raise SourceError(
                    f"{node_id}: malformed Fetch v{version} answer: {exc}", kind="malformed", node_down=True
                ) from exc
            self.fetch_version = resp.API_VERSION
            if resp.API_VERSION < 7:
                session.enabled = False  # no sessions before Fetch v7
            top_error = getattr(resp, "error_code", 0)
            if not top_error:
                session.answered(sreq, getattr(resp, "session_id", 0))
                return resp, session, sreq
            session.reset()
            if top_error not in SESSION_ERRORS or attempt == 2:
                raise SourceError(
                    f"{node_id}: fetch refused: {for_code(top_error).__name__}", kind="kafka", node_down=False
                )
            log.info("kafka fetch session reset", node=node_id, error=for_code(top_error).__name__)
        raise AssertionError("unreachable")

    def _broker_name(self, node_id: str) -> str:
        """``node <id> (<host>:<port>)`` as the cluster's metadata names it, for log lines."""
        meta = None if self._client is None else self._client.cluster.broker_metadata(int(node_id))
        return f"node {node_id}" if meta is None else f"node {node_id} ({meta.host}:{meta.port})"

    def _forgotten_ids(self, forgotten: dict[str, list[int]]) -> dict[str, str]:
        """Topic ids of the partitions a session forgets (v13 names them by id too)."""
        return {t: i for t in forgotten if (i := self._topic_id(t)) is not None}

    def _diverged(
        self, node_id: str, tp: TopicPartition, position: int, sent: int | None, epoch: int, end_offset: int
    ) -> PartitionResult | None:
        """A v12+ answer's diverging_epoch for the epoch ``sent`` with the fetch at ``position``: the
        same rule as an OffsetsForLeaderEpoch answer (LogIncarnations.divergence), at once."""
        if sent is None:
            return None  # we sent no epoch (-1): the broker cannot have compared one
        at = self.incarnations.divergence(tp, sent, epoch, end_offset, position)
        if at is None:
            # not a cut before the position (Kafka's broker never answers so): sending the same
            # epoch again would get the same empty answer, so stop sending it
            log.warning(
                "kafka diverging epoch without a cut before the position; epoch validation off",
                topic=tp.topic,
                partition=tp.partition,
                node=node_id,
                sent_epoch=sent,
                epoch=epoch,
                end_offset=end_offset,
                position=position,
            )
            self.incarnations.forget_epochs(tp)
            return None
        return self._truncated(node_id, tp, sent, at, position, "diverging epoch in the fetch answer")

    def _truncated(
        self, node_id: str, tp: TopicPartition, epoch: int, at: int, position: int, how: str
    ) -> PartitionResult:
        new = self.incarnations.truncated(tp, epoch, at)
        log.warning(
            "kafka log truncated",
            topic=tp.topic,
            partition=tp.partition,
            node=node_id,
            leader_epoch=epoch,
            diverged_at=at,
            position=position,
            incarnation=new,
            found_by=how,
        )
        return _changed(tp, new, at, f"log truncated at {at} (leader epoch {epoch}; {how})")

    async def _recheck(
        self, node_id: str, suspect: dict[TopicPartition, int], topic_ids: dict[TopicPartition, str | None]
    ) -> dict[TopicPartition, PartitionResult]:
        """Answers that a recreated topic or a truncated log also gives (beyond the end, out of
        range, unknown topic): read the metadata again, and check the position's epoch, before they
        are passed on; an INCARNATION_CHANGED result replaces them where one of those is the cause."""
        out: dict[TopicPartition, PartitionResult] = {}
        if self.metadata is None or all(topic_ids.get(tp) is None for tp in suspect):
            return out
        try:
            await self.metadata.refresh()
        except ConsumerError as exc:
            log.warning("kafka metadata refresh failed", error=str(exc))
            return out
        for tp in suspect:
            old, new = topic_ids.get(tp), self._topic_id(tp.topic)
            if old is not None and new is not None and new != old:
                inc, diverged = self.incarnations.check(tp, self.incarnations.check(tp, None, old)[0], new)
                out[tp] = _changed(tp, inc, 0 if diverged is None else diverged, "the topic was recreated")
        rest = {tp: off for tp, off in suspect.items() if tp not in out and topic_ids.get(tp) is not None}
        if rest:
            out.update(await self._check_epochs(node_id, rest))
        return out

    async def _check_epochs(
        self, node_id: str, positions: dict[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionResult]:
        """KIP-320: the end offset of each position's leader epoch, asked of each partition's leader
        (a follower answers a consumer's OffsetsForLeaderEpoch NOT_LEADER_OR_FOLLOWER), ``node_id``
        where the leader is unknown. Results only for partitions that must not be fetched now:
        truncated (INCARNATION_CHANGED) or not served."""
        by_node: dict[str, dict[TopicPartition, int]] = {}
        for tp, off in positions.items():
            by_node.setdefault(self._leader(tp) or node_id, {})[tp] = off
        out: dict[TopicPartition, PartitionResult] = {}
        for target, group in by_node.items():
            try:
                out.update(await self._check_epochs_on(target, group))
            except SourceError as exc:
                if target == node_id:
                    raise
                # the leader failed, not the replica being fetched: those partitions wait (pending)
                for tp, off in group.items():
                    why = f"leader epoch check on leader {target}: {exc}"
                    out[tp] = PartitionResult(
                        tp, FetchStatus.NOT_SERVED, off, 0, 0, None, None, why, _no_data
                    )
        return out

    async def _check_epochs_on(
        self, node_id: str, positions: dict[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionResult]:
        assert self._client is not None
        incs = self.incarnations
        epochs = {tp: incs.epoch_at(tp, off) for tp, off in positions.items()}
        asked = {tp: e for tp, e in epochs.items() if e is not None}
        for tp in positions:
            if tp not in asked:
                incs.pending.discard(tp)  # no epoch seen for the position: nothing to check against
        if not asked or not self._epoch_checks_supported:
            incs.pending.difference_update(positions)
            return {}
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, epoch in asked.items():
            by_topic.setdefault(tp.topic, []).append((tp.partition, epoch))
        try:
            resp = await self._client.send(int(node_id), OffsetsForLeaderEpochRequest(by_topic))
        except IncompatibleBrokerVersion:
            self._epoch_checks_supported = False
            incs.pending.difference_update(positions)
            log.warning(
                "the Kafka broker has no OffsetsForLeaderEpoch: a truncated log (after a leader change) "
                "cannot be told from a log that only changed leader",
                node=node_id,
            )
            return {}
        except (KafkaError, OSError) as exc:
            raise SourceError(
                f"{node_id}: leader epoch check: {exc!r}", kind="transport", node_down=True
            ) from exc
        self.epoch_checks += 1
        out: dict[TopicPartition, PartitionResult] = {}
        for tp, (error_code, epoch, end_offset) in epoch_end_offsets(resp).items():
            if tp not in asked:
                continue
            position = positions[tp]
            if error_code:
                # keep it pending: the next route (metadata refreshed) checks again
                why = f"leader epoch check: {for_code(error_code).__name__}"
                out[tp] = PartitionResult(
                    tp, FetchStatus.NOT_SERVED, position, 0, 0, None, None, why, _no_data
                )
                continue
            incs.pending.discard(tp)
            at = incs.divergence(tp, asked[tp], epoch, end_offset, position)
            if at is not None:
                out[tp] = self._truncated(node_id, tp, asked[tp], at, position, "OffsetsForLeaderEpoch")
        return out

    async def _out_of_range(
        self, node_id: str, tps: list[TopicPartition], offsets: dict[TopicPartition, int]
    ) -> list[PartitionResult]:
        """OFFSET_OUT_OF_RANGE with the log's bounds looked up (Kafka's answer carries none)."""
        try:
            first = await self.list_offsets(node_id, tps, "earliest")
            last = await self.list_offsets(node_id, tps, "latest")
        except ConsumerError as exc:
            return [
                PartitionResult(tp, FetchStatus.NOT_SERVED, offsets[tp], 0, 0, None, None,
                                f"offset out of range; bounds lookup failed: {exc}", _no_data)
                for tp in tps
            ]  # fmt: skip
        out = []
        for tp in tps:
            start, end = first[tp], last[tp]
            status, nxt = out_of_range_outcome(offsets[tp], start, end)
            out.append(PartitionResult(tp, status, nxt, start, end, None, None, "OffsetOutOfRange", _no_data))
        return out

    # -- offsets ---------------------------------------------------------------------------------

    async def list_offsets(
        self, node_id: str, tps: list[TopicPartition], spec: str, timestamp: int | None = None
    ) -> dict[TopicPartition, int]:
        """Asked of each partition's leader, whatever ``node_id`` says: a Kafka follower answers
        ListOffsets (and a Fetch without a rack) with NOT_LEADER_OR_FOLLOWER, and ``node_id`` is the
        partition's pull node, a follower while the leader names one (read_replica.py)."""
        if self._client is None:
            raise ConsumerError("kafka source not started", retriable=True)
        if spec == "timestamp" and timestamp is None:
            raise ConsumerError("offset lookup by timestamp needs a timestamp", retriable=False)
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            route = None if self.cluster is None else self.cluster.partitions.get(tp)
            leader = node_id if route is None or route.leader == NO_LEADER else route.leader
            by_leader.setdefault(leader, []).append(tp)
        out: dict[TopicPartition, int] = {}
        for leader, group in by_leader.items():
            out.update(await self._list_offsets_at(leader, group, spec, timestamp))
        return out

    async def _list_offsets_at(
        self, node_id: str, tps: list[TopicPartition], spec: str, timestamp: int | None
    ) -> dict[TopicPartition, int]:
        assert self._client is not None
        when = {"earliest": EARLIEST, "latest": LATEST}.get(spec, timestamp)
        assert when is not None
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append((tp.partition, when))
        request = OffsetRequest(-1, READ_COMMITTED if self.read_committed else 0, list(by_topic.items()))
        try:
            resp = await self._client.send(int(node_id), request)
        except (KafkaError, OSError) as exc:
            raise ConsumerError(f"{node_id}: offset lookup failed: {exc!r}", retriable=True) from exc
        out: dict[TopicPartition, int] = {}
        beyond: list[TopicPartition] = []
        for topic, parts in resp.topics:
            for part in parts:
                partition, error_code, offset = part[0], part[1], part[3]
                tp = TopicPartition(topic, partition)
                if error_code:
                    raise ConsumerError(
                        f"{tp}: offset lookup ({spec}): {for_code(error_code).__name__}", retriable=True
                    )
                if offset < 0:
                    beyond.append(tp)  # no record at or after the timestamp: the log end
                else:
                    out[tp] = offset
        if beyond:
            out.update(await self._list_offsets_at(node_id, beyond, "latest", None))
        if spec == "latest" and out:
            out = await self._confirm_ends(node_id, out)
        return out

    async def _confirm_ends(self, node_id: str, ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The log ends as a Fetch's high watermark (last stable offset under read_committed) says:
        Tansu answers ListOffsets "latest" with the last batch's base offset + 1, not the log end."""
        assert self._client is not None
        ids = {tp.topic: i for tp in ends if (i := self._topic_id(tp.topic)) is not None}
        request = KafkaFetchRequest(
            max_wait_time=1,  # see fetch(): not 0
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=READ_COMMITTED if self.read_committed else 0,
            topics=self._ordered([FetchRequest(tp, off, 1 << 16) for tp, off in ends.items()]),
            topic_ids=ids,
        )
        try:
            resp = parsed_fetch(await self._client.send(int(node_id), request))
        except (KafkaError, OSError, MalformedAnswer) as exc:
            raise ConsumerError(f"{node_id}: log end lookup failed: {exc!r}", retriable=True) from exc
        out = dict(ends)
        for part in fetched_partitions(resp, {i: t for t, i in ids.items()}):
            if part.topic is None:
                continue
            tp = TopicPartition(part.topic, part.partition)
            end = part.last_stable if self.read_committed and part.last_stable >= 0 else part.highwater
            if part.error_code == 0 and tp in out and end > out[tp]:
                out[tp] = end
        return out

    # -- consumer group --------------------------------------------------------------------------

    def consumer_group(self, settings: GroupSettings, on_change: Callable[[], None]) -> ConsumerGroup:
        kafka = self._config.kafka
        if kafka.group_protocol == "consumer":  # KIP-848: the broker assigns
            member = ConsumerProtocolGroup(
                client=lambda: self._client,
                topic_ids=lambda: {} if self.metadata is None else self.metadata.topic_ids,
                request_refresh=self.request_refresh,
                settings=settings,
                on_change=on_change,
                instance_id=kafka.group_instance_id or None if kafka.static_membership else None,
                static=kafka.static_membership,
                remote_assignor=kafka.remote_assignor,
                rack=kafka.client_rack or None,
                error_backoff=self._config.error_backoff_ms / 1000,
            )
            return ConsumerGroup(member, ConsumerProtocolOffsetStore(member, settings))
        group = KafkaGroup(
            client=lambda: self._client,
            cluster=lambda: self.cluster,
            settings=settings,
            on_change=on_change,
            instance_id=self._config.kafka.group_instance_id or None,
            static=self._config.kafka.static_membership,
            error_backoff=self._config.error_backoff_ms / 1000,
        )
        return ConsumerGroup(group, KafkaOffsetStore(group, settings))
