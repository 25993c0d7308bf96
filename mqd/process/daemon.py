"""The daemon: Consumer -> LandingSink -> commit, on one asyncio loop (DESIGN.md §2-3).

The working loop drains what the consumer has buffered, hands it to the sink, and starts a
publication task for every partition whose micro-batch is due. It never awaits a publication:
fetching and decoding (loop thread) overlap encoding and fsync (the sink's worker threads). A
finished publication marks its offsets consumed (the consumer's offset store commits them
periodically and on stop). The landing directory is the source of truth for positions: every
newly assigned partition resumes after its last published offset.

Publication scheduling (one task per partition, worker slots, busy partitions, the progress
signal, ownership) lives in the sink (landing/sink.py); the loop asks it what is due, starts
publications, and receives each one's typed ``PublishResult``. A result is marked consumed in any
case (it was conditional, so what it landed is the truth, and commits only move forward), but a
re-seek after a conflict is applied only if the sink says the partition is still owned by the
incarnation that published. When everything due is already being published, the loop waits for
a publication to end (or for data, or a timeout) instead of spinning.

Failure handling:

* publication conflict (another owner published first): the batch is dropped and the partition
  re-seeks after what is landed;
* landing directory unwritable (disk full, read-only, permissions): every owned partition is
  paused, buffered records are kept, nothing is committed; publication is retried every
  ``landing.disk_retry_interval`` and fetching resumes once it succeeds. ``health()`` says
  degraded with the reason meanwhile;
* a broken claim chain (a claim deleted, overwritten or unreadable: errors.ChainBroken) is not
  the disk's and no retry fixes it: that partition alone stops (paused, its buffered records
  dropped, nothing committed past the landing), counted, logged naming the object, and reported by
  ``health()`` (so ``mqd status`` exits 1) until a start position of it reads a whole chain again
  (a repair, then a restart or a new assignment). A burst run fails on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from mqd import metrics
from mqd.config import ConsumerConfig, MqdConfig
from mqd.consumer import (
    Consumer,
    ConsumerError,
    ConsumerSnapshot,
    StartPosition,
    TopicPartition,
)
from mqd.consumer.memory_gauge import MemoryGauge
from mqd.consumer.source import LandedEpoch
from mqd.fsutil import LockTimeout
from mqd.landing import layout
from mqd.landing.errors import ChainBroken, CommitLockTimeout, LandingCorrupt, LandingError, TableUnavailable
from mqd.landing.markers import IDLE_GRACE_MS
from mqd.landing.sink import LandingSink, PublishResult
from mqd.process import reset_records
from mqd.process.state import DaemonSnapshot, DaemonState
from mqd.sources import open_source

if TYPE_CHECKING:
    from mqd.landing.table_committer import TableCommitter

log = structlog.get_logger("mqd.daemon")

_LOOP_WAIT = 0.5  # longest idle wait of the working loop (keeps last_loop_time fresh)
_HOUSEKEEPING_INTERVAL = 2.0  # idle watermarks
_MARKER_INTERVAL = 10.0  # completeness markers
_BURST_LOOK_S = 0.05  # a burst: how often partitions at their log end are looked for (_publish_due)


def _use_jemalloc_pool() -> None:
    """Let Arrow allocate from its jemalloc pool, unless the operator chose a pool
    (ARROW_DEFAULT_MEMORY_POOL) or this pyarrow has none. The Kafka source decodes into Arrow's pool
    and the landing encodes from it, so the records' memory stays out of glibc's heap; measured on
    the ``kafka`` shape (bench.kafka_rss) peak RSS above idle 148.5 -> 128.0 MiB and CPU 3.04 ->
    2.83 s per 6 M records against the system pool (docs/decisions/043-fetch-answers-in-place-jemalloc.md).
    Process-wide: the daemon owns its process.

    Before pyarrow is imported (it is, only once the first fetch is out: issue 16) the variable
    says it, and Arrow reads it when it makes its default pool."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    if "pyarrow" not in sys.modules:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"
        return
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "jemalloc":
        with contextlib.suppress(NotImplementedError):  # a pyarrow built without it
            pa.set_memory_pool(pa.jemalloc_memory_pool())


def _consumer_config(config: MqdConfig) -> ConsumerConfig:
    """The consumer's settings, its flow polls' wait at most a tenth of the landing's max_age: the
    landing counts their records' age from the poll's send, so a longer wait would only make files
    younger (decision 078)."""
    cap_ms = int(config.landing.max_age * 100)
    if config.consumer.flow_wait_ms <= cap_ms:
        return config.consumer
    return config.consumer.model_copy(update={"flow_wait_ms": cap_ms})


class Daemon:
    """Pulls the configured topics and lands them exactly once. See the module docstring."""

    def __init__(self, config: MqdConfig, *, burst: bool = False) -> None:
        self._config = config
        self.burst = burst
        # the budget bounds the process's RSS above idle, not only what it charges (memory_gauge.py);
        # its baseline is taken once the landing encoded once (landing/preflight.py)
        self.memory = MemoryGauge()
        self.sink = LandingSink(config.landing, on_result=self._apply, on_warm=self._take_memory_baseline)
        # landing.table = "delta": what is published is also committed to the landing's Delta table
        self.table: TableCommitter | None = self._table_committer(config)
        consumer_config = _consumer_config(config)
        self.consumer = Consumer(
            consumer_config,
            start_position=self._start_position,
            listener=self,
            source=open_source(consumer_config),  # the source builds its own connections
            budget_held=True,  # the budget bounds answers until published, not only until drained
            memory_gauge=self.memory,
        )
        self.state = DaemonState.CREATED
        self.last_loop_time = time.monotonic()
        self._started_at: float | None = None
        self._user_paused: set[TopicPartition] = set()
        self._disk_paused: set[TopicPartition] = set()
        self._broken: dict[TopicPartition, ChainBroken] = {}  # partitions stopped on a broken chain
        self._chain_breaks = 0
        self._landing_error: str | None = None
        self._next_disk_retry = 0.0
        self._stop_event = asyncio.Event()
        self._work_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._errors: deque[dict[str, Any]] = deque(maxlen=20)
        self._next_housekeeping = 0.0
        self._next_caught_up_look = 0.0  # a burst's look for partitions at their log end
        self._finished_early: set[tuple[str, int]] = set()  # their files finished before the end
        self._next_markers = 0.0
        self._next_clean = 0.0  # landing.lifecycle.interval (mqd/landing/lifecycle.py)
        self._cleaner: Any = None
        self._watermark_hour: dict[TopicPartition, int] = {}
        self._commits = 0
        self._markers = 0
        self._marker_lock_timeouts = 0  # marker rounds skipped: the topic's marker lock was held
        self._consumer_started = False
        self._reset_skipped = 0  # offsets skipped by applied `mqd offsets reset` records
        self._reset_replayed = 0  # offsets landed again by applied replays
        # partitions replaying a range (mqd offsets reset below the landed head): tagged on drain
        self._replays: dict[TopicPartition, reset_records.Replay] = {}

    def _table_committer(self, config: MqdConfig) -> TableCommitter | None:
        if config.landing.table != "delta":
            return None
        import importlib.util

        from mqd.landing import delta_log

        if importlib.util.find_spec("deltalake") is None:
            raise TableUnavailable(
                'landing.table = "delta" needs the deltalake package (delta-rs), a dependency of mqd: '
                'reinstall mqd (pip install mqd), or set landing.table = "none"'
            )
        from mqd.landing.table_committer import TableCommitter

        lc = config.landing
        uri = delta_log.table_uri(lc.dir)
        table = delta_log.LandingTable(
            uri,
            self.sink.store.objects,
            storage=delta_log.storage_options(uri, lc.s3.endpoint_url, lc.s3.region),
            checkpoint_interval=lc.delta.checkpoint_interval,
            log_retention_s=lc.delta.log_retention,
        )
        return TableCommitter(
            self.sink.store.objects,
            table,
            interval=lc.delta.commit_interval,
            max_files=lc.delta.commit_files,
            name=config.consumer.effective_client_id,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the landing directory, start the consumer (first assignment resolved from the
        landing directory). An unwritable landing directory does not fail start: the daemon comes
        up degraded, paused, and retries."""
        if self.state != DaemonState.CREATED:
            return
        self.state = DaemonState.STARTING
        self._started_at = time.monotonic()
        _use_jemalloc_pool()
        try:
            await self.sink.start()
        except LandingError as exc:
            self._set_landing_error(exc)
        except LandingCorrupt as exc:
            # not ours to fix (another landing format, a foreign marker): refuse to start
            self.state = DaemonState.FAILED
            log.error("landing directory refused", error=str(exc))
            await self.sink.close()
            raise
        cc = self._config.consumer
        # until the first metadata answer nothing else is logged: say what start waits for
        log.info(
            "waiting for cluster metadata",
            source=cc.source,
            bootstrap=list(cc.bootstrap),
            timeout_s=cc.request_timeout,
        )
        try:
            await self.consumer.start()
        except BaseException:
            self.state = DaemonState.FAILED  # the consumer cleaned up after itself
            await self.sink.close()
            raise
        self._consumer_started = True
        self.sink.start_preflight()  # after the first fetch: it imports pyarrow (issue 16)
        if self._landing_error is not None:
            self._pause_for_disk(self.consumer.assignment())
        self.state = DaemonState.RUNNING
        log.info(
            "daemon started",
            landing=str(self._config.landing.dir),
            burst=self.burst,
            owned=len(self.consumer.assignment()),
        )

    async def run(self, shutdown: Awaitable[object] | None = None) -> None:
        """Work until ``shutdown`` resolves (or, in burst mode, until everything owned is landed
        and committed), then stop()."""
        if self.state == DaemonState.CREATED:
            await self.start()
        if self.state != DaemonState.RUNNING:
            return
        self._work_task = asyncio.create_task(self._work(), name="mqd-daemon-work")
        waiters: set[asyncio.Future[Any]] = {self._work_task}
        trigger = asyncio.ensure_future(shutdown) if shutdown is not None else None
        if trigger is not None:
            waiters.add(trigger)
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if trigger is not None and not trigger.done():
                trigger.cancel()
            await self.stop()
        if self._work_task.done() and not self._work_task.cancelled() and self._work_task.exception():
            raise self._work_task.exception()  # type: ignore[misc]

    async def stop(self, timeout: float | None = None) -> None:
        """Stop fetching, publish what is buffered (bounded by ``timeout``, default
        daemon.shutdown_timeout), commit, leave the group. Idempotent."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float | None) -> None:
        if not self._consumer_started or self.state == DaemonState.STOPPED:
            if self.state != DaemonState.FAILED:
                self.state = DaemonState.STOPPED
            await self.sink.close()
            self.memory.stop()
            return
        self.state = DaemonState.STOPPING
        self._stop_event.set()
        if self._work_task is not None and not self._work_task.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._work_task
        deadline = timeout if timeout is not None else self._config.daemon.shutdown_timeout
        stop_by = time.monotonic() + deadline  # one deadline for the drain and the table's commit
        owned = self.consumer.assignment()
        self.consumer.pause(owned)  # stop fetching; what is buffered still lands
        try:
            await asyncio.wait_for(self._final_publish(), deadline)
        except TimeoutError:
            log.error(
                "shutdown drain exceeded its deadline; unpublished records are fetched again "
                "on the next start",
                timeout_s=deadline,
                pending=self.sink.pending_records,
            )
        except Exception as exc:  # still commit what landed and leave the group
            self._record_error("final_flush", exc)  # the status JSON's name for the final publication
        self.sink.cancel()  # abandoned at the deadline: the publication itself is atomic and conditional
        if self.table is not None:
            await self._final_table_commit(max(0.0, stop_by - time.monotonic()))
        try:
            await self.consumer.commit()
            self._commits += 1
        except ConsumerError as exc:
            self._record_error("final_commit", exc)
        await self.consumer.stop()
        await self.sink.close()
        if self.table is not None:
            self.table.close()
        self.memory.stop()
        self.state = DaemonState.STOPPED
        log.info("daemon stopped", **self.stats)

    async def _final_table_commit(self, deadline: float) -> None:
        """Every stop (and the end of a burst) commits what was published to the landing table,
        the chains of every owned partition read once more, bounded by the shutdown deadline."""
        assert self.table is not None
        owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        try:
            done = await asyncio.wait_for(self.table.flush(owned), deadline)
        except TimeoutError:
            done = False
        if not done:
            log.error(
                "landing table not committed before exit; the next owner of each partition commits "
                "what is missing",
                pending_files=self.table.status()["pending_files"],
                error=self.table.error,
            )
            self._record_error(
                "final_table_commit", RuntimeError(self.table.error or "not committed in time")
            )
        else:
            log.info("landing table committed", version=self.table.stats.version)

    async def _final_publish(self) -> None:
        await self.sink.wait_idle()
        # fetching is paused: land what the consumer still holds, a sink-full at a time
        while True:
            self._drain()
            if not self.sink.pending_records:
                return
            if self._landing_error is not None and not await self._landing_writable():
                return
            await self._publish(None)
            if self._landing_error is not None:
                return

    # -- the working loop ------------------------------------------------------------------------

    async def _work(self) -> None:
        try:
            while not self._stop_event.is_set():
                if self.sink.failure is not None:
                    raise self.sink.failure
                now = time.monotonic()
                self.last_loop_time = now
                await self._wait_for_work(now)
                self._drain()
                await self._publish_due()
                if self.table is not None:
                    self.table.start(now)
                await self._housekeeping()
                if self.burst and self._broken:
                    raise next(iter(self._broken.values()))  # a burst cannot finish that partition
                if self.burst and self._burst_done():
                    await self._housekeeping(force=True)  # idle watermarks and markers, once more
                    log.info("burst complete", **self.stats)
                    return
            if self.sink.failure is not None:
                raise self.sink.failure
        except Exception as exc:
            self.state = DaemonState.FAILED
            self._record_error("work_loop", exc)
            log.exception("working loop failed")
            raise

    def _room(self) -> int:
        """Bytes the sink may still take from the consumer: its buffers and the micro-batches
        being published hold at most landing.max_bytes (plus one batch) together."""
        return self._config.landing.max_bytes - self.sink.pending_bytes - self.sink.inflight_bytes

    async def _wait_for_work(self, now: float) -> None:
        """Sleep until data can be drained, a buffer falls due, or a publication ends, whichever
        comes first (at most _LOOP_WAIT)."""
        if self._landing_error is not None:
            # overdue buffers wait for the retry, and the retry for the publications in flight
            due_in: float | None = None if self.sink.running else self._next_disk_retry - now
        else:
            due_in = self.sink.next_due_in(now)  # busy partitions are not counted: no spin on them
        timeout = _LOOP_WAIT if due_in is None else min(_LOOP_WAIT, due_in)
        if timeout <= 0:
            return
        data = self._room() > 0  # with the sink full, new data cannot be taken: do not wake for it
        if not self.sink.running:
            if data:
                await self.consumer.wait_for_data(timeout)
            else:
                await asyncio.sleep(timeout)
            return
        # a publication taking its buffer makes room, its end may let a busy partition be cut
        await self.sink.wait_for_progress(timeout, self.consumer.wait_for_data(timeout) if data else None)

    def _drain(self) -> None:
        room = self._room()
        if room <= 0:
            return  # the sink is full: publications in flight make room
        for batch in self.consumer.fetched_batches(max_bytes=room):
            if not self.consumer.is_owned(batch.tp, batch.epoch):
                continue  # revoked or re-seeked since it was fetched
            replay = self._replays.get(batch.tp) if self._replays else None
            if replay is None:
                self.sink.add(batch)
            else:  # a deliberate replay: its range lands under the replay id
                for piece in reset_records.retag(batch, replay):
                    self.sink.add(piece)

    async def _publish_due(self) -> None:
        now = time.monotonic()
        if self._landing_error is not None:
            # degraded: retry serially, once the publications started before the error have ended
            if now < self._next_disk_retry or self.sink.running:
                return
            if not await self._landing_writable():
                return
            await self._publish(None)
            return
        if self.burst and self.sink.pending_records:
            if self.consumer.caught_up():
                # nothing more is coming: do not wait for max_age, finish the open files
                self._burst_ending()
                self.sink.start_publications(list(self.sink.pending()), finish=True)
                return
            if now >= self._next_caught_up_look:
                self._finish_caught_up(now)
        due = self.sink.due(now)  # by age or size, also under pressure: else the loop spins on them
        if self.sink.pending_records and (need := self.consumer.memory_shortfall()):
            # the budget is held by answers the sink's buffers pin: cut the biggest buffers, enough
            # to fetch again (not all of them: files stay large), else fetching waits for max_age
            due += [tp for tp in self.sink.pressure_cut(need) if tp not in due]
        self.sink.start_publications(due)

    def _finish_caught_up(self, now: float) -> None:
        """A burst: the files of partitions at their log end are finished while the others are
        fetched, not with theirs at the end (nor do their records keep the answers they came in
        pinned until then). Once per partition: one still written to (a producer during the
        burst) would otherwise land a small file per look. Looked for at most every
        _BURST_LOOK_S, since a look walks every partition the landing holds."""
        self._next_caught_up_look = now + _BURST_LOOK_S
        done = [
            tp
            for tp in self.sink.pending()
            if tp not in self._finished_early and self.consumer.partition_caught_up(TopicPartition(*tp))
        ]
        self._finished_early.update(done)
        self.sink.start_publications(done, finish=True)

    def _burst_ending(self) -> None:
        """A burst's last publications start: the process exits once they and the table's commit
        are done (issue 34), and giving the heap back after them would be work for nothing. More
        records after this (the log grew) only mean a burst that ends later without a trim."""
        self.sink.trim_when_idle = False

    async def _publish(self, tps: list[tuple[str, int]] | None) -> None:
        """Publish now and wait (final publication, retries after a disk error)."""
        results = await self.sink.publish(tps)  # each one applied by _apply
        if not any(res.error is not None for res in results) and self._landing_error is not None:
            self._clear_landing_error()

    def _take_memory_baseline(self) -> None:
        # The landing encoded once: pyarrow, numpy and the writer's modules are in for good, ~20k
        # objects no full collection needs to walk again (a burst's last trim_heap walked them all).
        # Only where the process's owner froze its start-up (`mqd run`, cli.py): a test or an
        # application running a Daemon in its own process decides about its own objects.
        if gc.get_freeze_count():
            gc.freeze()
        self.consumer.take_memory_baseline()

    def _apply(self, res: PublishResult) -> None:
        """The sink's result of one publication (called as it ends)."""
        tp = TopicPartition(*res.tp)
        # Whatever is landed may be committed, owned or not: a publication that ends after a revoke,
        # or the landed end a conflict revealed, is the truth (commits only move forward), and the
        # new owner may never publish past it to commit it itself.
        if res.next_offset is not None:
            if self.table is not None:
                self.table.note(res.tp, res.published)
            self.consumer.mark_consumed(tp, res.next_offset)
            self.consumer.note_landed(tp, max(r.ts_max for r in res.published))
        if res.conflict is not None and res.conflict.last_offset is not None:
            self.consumer.mark_consumed(tp, res.conflict.last_offset + 1)
        if res.conflict is not None and res.owned:
            last = res.conflict.last_offset
            # resume after what is landed, in the log incarnation it was landed from (a replay
            # id is the landing's name for the replayed range: the broker knows the log's)
            inc = res.conflict.incarnation
            replay = self._replays.get(tp)
            if replay is not None and inc == replay.replay_id:
                inc = replay.incarnation
            self.consumer.seek(tp, 0 if last is None else last + 1, inc)
        if isinstance(res.error, CommitLockTimeout):
            pass  # one partition's lock held (frozen holder): its batch is kept and retried, the rest go on
        elif isinstance(res.error, ChainBroken):
            self._chain_broken(tp, res.error)
        elif res.error is not None:
            self._set_landing_error(res.error)

    def _burst_done(self) -> bool:
        return (
            bool(self.consumer.assignment())
            and self.consumer.assignment_resolved()  # a partition still waiting is not landed yet
            and self._landing_error is None
            and not self.sink.running
            and self.sink.pending_records == 0
            and self.consumer.caught_up()
        )

    # -- disk errors -----------------------------------------------------------------------------

    def _set_landing_error(self, exc: Exception) -> None:
        first = self._landing_error is None
        self._landing_error = str(exc)
        self._next_disk_retry = time.monotonic() + self._config.landing.disk_retry_interval
        if first:
            log.error(
                "landing unwritable (directory or object store); fetching paused until it recovers",
                error=str(exc),
            )
            self._record_error("landing", exc)
        self._pause_for_disk(self.consumer.assignment() if self.state != DaemonState.STARTING else ())

    def _pause_for_disk(self, tps: Iterable[TopicPartition]) -> None:
        fresh = [tp for tp in tps if tp not in self.consumer.paused()]
        if fresh:
            self.consumer.pause(fresh)
            self._disk_paused.update(fresh)

    def _clear_landing_error(self) -> None:
        log.info("landing directory writable again; fetching resumes", was=self._landing_error)
        self._landing_error = None
        resume = [tp for tp in self._disk_paused if tp not in self._user_paused and tp not in self._broken]
        self._disk_paused.clear()
        if resume:
            self.consumer.resume(resume)

    async def _landing_writable(self) -> bool:
        try:
            await self.sink.start()
        except LandingError as exc:
            self._landing_error = str(exc)
            self._next_disk_retry = time.monotonic() + self._config.landing.disk_retry_interval
            return False
        if self.sink.pending_records == 0:
            self._clear_landing_error()
        return True

    # -- broken claim chains --------------------------------------------------------------------

    def _chain_broken(self, tp: TopicPartition, exc: ChainBroken) -> None:
        """Stop ``tp`` alone: no retry repairs a chain, and publishing after a broken link would
        land records that readers never reach (or reach twice)."""
        first = tp not in self._broken
        self._broken[tp] = exc
        if first:
            self._chain_breaks += 1
            metrics.landing_chain_broken.labels(tp.topic).inc()
            log.error(
                "landing claim chain broken; partition stopped until the chain is repaired",
                tp=str(tp),
                object=exc.key,
                problem=exc.problem,
            )
            self._record_error("landing_chain", exc)
        if tp in self.consumer.assignment():
            self.consumer.pause([tp])
            dropped = self.sink.drop(tp)  # never published past the break; fetched again once repaired
            if dropped:
                log.info("records of a partition with a broken chain dropped", tp=str(tp), records=dropped)

    def _chain_whole(self, tp: TopicPartition) -> None:
        """A start position of ``tp`` read its whole chain: a repair (or another owner's fix)."""
        if self._broken.pop(tp, None) is not None:
            log.info("landing claim chain readable again; partition resumes", tp=str(tp))

    # -- watermarks and completeness markers -----------------------------------------------------

    async def _housekeeping(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._landing_error is not None or (now < self._next_housekeeping and not force):
            return
        self._next_housekeeping = now + _HOUSEKEEPING_INTERVAL
        try:
            await self._idle_watermarks()
            if now >= self._next_markers or force:
                self._next_markers = now + _MARKER_INTERVAL
                await self._update_markers()
            interval = self._config.landing.lifecycle.interval
            if interval > 0 and now >= self._next_clean:
                self._next_clean = now + interval
                await self._clean_landing()
        except LandingError as exc:
            self._set_landing_error(exc)
        except LockTimeout as exc:
            # a marker lock held by another process (frozen?): landing goes on, markers next round
            self._marker_lock_timeouts += 1
            log.warning("completeness markers skipped: lock held; retried later", error=str(exc))
        except (OSError, LandingCorrupt) as exc:
            self._record_error("housekeeping", exc)

    async def _clean_landing(self) -> None:
        """Delete what every registered Spark query committed (mqd/landing/lifecycle.py). A failure
        is recorded and retried next interval; it never pauses the landing."""
        from mqd.landing.lifecycle import Cleaner

        lc = self._config.landing.lifecycle
        if self._cleaner is None:
            retention_ms = int(lc.retention * 1000) or None
            self._cleaner = Cleaner(self.sink.store, archive_dir=lc.archive_dir, retention_ms=retention_ms)
        try:
            await self.sink.run_blocking(self._cleaner.clean)
        except (LandingError, LandingCorrupt, OSError) as exc:
            self._record_error("lifecycle", exc)

    async def _idle_watermarks(self) -> None:
        """A partition at its log end with nothing buffered vouches for event times up to now
        (minus a grace for records in flight): its hours can be marked complete."""
        from mqd.wire.format import now_ms  # pyarrow: not on the start path

        pending = self.sink.pending()
        mark = now_ms() - IDLE_GRACE_MS
        hour = mark // layout.HOUR_MS
        # a publication in flight is not visible yet: its hour cannot be vouched for
        tps = [
            tp
            for tp in self.consumer.idle_partitions()
            if not (pending.get(tp) or self.sink.busy(tp) or self._watermark_hour.get(tp, -1) >= hour)
        ]
        # each partition's watermark is its own object: written side by side, the fsyncs overlap
        # (a burst's end writes one per partition; one by one they took 10-60 ms for 12, issue 34)
        advance = self.sink.store.advance_watermark
        done = await asyncio.gather(
            *(self.sink.run_blocking(advance, tp.topic, tp.partition, mark) for tp in tps),
            return_exceptions=True,
        )
        failed: BaseException | None = None
        for tp, res in zip(tps, done, strict=True):
            if isinstance(res, BaseException):
                failed = failed or res
            else:
                self._watermark_hour[tp] = hour
        if failed is not None:
            raise failed

    async def _update_markers(self) -> None:
        for topic in self.consumer.subscribed_topics():  # patterns resolved
            n = self.consumer.partition_count(topic)  # the consumer's metadata cache
            if not n:
                continue
            created = await self.sink.run_blocking(self.sink.store.update_markers, topic, n)
            self._markers += len(created)
            for marker in created:
                log.info("hour complete", marker=marker)

    # -- rebalance listener ----------------------------------------------------------------------

    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self._replays.pop(tp, None)  # a new owner's start hook takes the replay on
            dropped = self.sink.forget(tp)
            self._disk_paused.discard(tp)
            self._broken.pop(tp, None)  # its new owner finds the break itself (and says so)
            self._watermark_hour.pop(tp, None)
            if dropped:
                log.info("revoked partition: unpublished records dropped", tp=str(tp), records=dropped)

    async def on_partitions_released(self, tps: set[TopicPartition]) -> None:
        # a publication that took its buffer before the revoke ends (and is marked) before the
        # offsets are committed and the group hears of the release (KIP-848 acknowledges then)
        await self.sink.settle(tps)

    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        if self._landing_error is not None:
            self._pause_for_disk(tps)
        again = [tp for tp in tps if tp in self._user_paused]
        if again:
            self.consumer.pause(again)

    async def _start_position(self, tp: TopicPartition) -> StartPosition | None:
        try:
            head = await self.sink.resume_head(tp)
        except LockTimeout as exc:
            # another process holds the partition's publication lock (frozen inside a commit?):
            # this partition waits for the next rebalance round, the others start now
            log.warning("landing lock held too long; partition retried later", tp=str(tp), error=str(exc))
            raise ConsumerError(f"{tp}: landing lock held by another process: {exc}", retriable=True) from exc
        except ChainBroken as exc:
            self._chain_broken(tp, exc)
            # retried with the next rebalance round, like an unreadable state: a repair lets it go on
            raise ConsumerError(f"{tp}: {exc}", retriable=True) from exc
        except (LandingError, LandingCorrupt) as exc:
            self._record_error("resume_position", exc)
            # retriable: the consumer retries the assignment; nothing is fetched without a position
            raise ConsumerError(f"{tp}: cannot read landing state: {exc}", retriable=True) from exc
        self._chain_whole(tp)
        if self.table is not None:
            self.table.track((tp.topic, tp.partition))  # files published but not committed: catch up
        position = None if head.last_offset is None else head.last_offset + 1
        position, incarnation = await self._apply_offsets_reset(tp, position, head.incarnation)
        if position is None:
            return None
        self.consumer.mark_consumed(tp, position)  # a lost or lagging broker commit catches up
        landed = None
        if head.last_offset is not None and head.leader_epoch is not None:
            # a Kafka source checks the landed position against its log before fetching after it
            landed = LandedEpoch(head.incarnation, head.last_offset, head.leader_epoch)
        return StartPosition(position, incarnation, landed)

    async def _apply_offsets_reset(
        self, tp: TopicPartition, position: int | None, incarnation: str | None
    ) -> tuple[int | None, str | None]:
        """A `mqd offsets reset` record for ``tp`` (mqd/process/reset_records.py) moves the start
        position while the landed head is still the one it was decided against; a stale one is
        removed."""
        landing = self.sink.store.objects  # the records' store: a directory or s3://
        loop = asyncio.get_running_loop()
        try:
            rec = await loop.run_in_executor(None, reset_records.read_reset, landing, tp)
        except reset_records.ResetError as exc:
            self._record_error("offsets_reset", exc)
            raise ConsumerError(f"{tp}: {exc}", retriable=True) from exc
        if rec is None:
            return position, incarnation
        r = reset_records.resume(rec, position, incarnation)
        if r.outcome == "cleared":
            # landed past it: a replay that finished, or landings since (applying it now could
            # move the partition back over them)
            log.info(
                "offsets reset record done",
                tp=str(tp),
                reset_to=rec.to_offset,
                reset_landed=rec.landed_next,
                landed=position,
            )
            self._replays.pop(tp, None)
            await loop.run_in_executor(None, reset_records.clear_reset, landing, tp)
            return position, incarnation
        if r.replay is not None:
            self._replays[tp] = r.replay
        if r.outcome == "replaying":
            log.warning(
                "offsets reset: replay resumes",
                tp=str(tp),
                at=position,
                replay_end=r.replay.end if r.replay else None,
            )
            return r.position, r.incarnation
        self._reset_skipped += r.skipped
        self._reset_replayed += r.replayed
        log.warning(
            "offsets reset applied",
            tp=str(tp),
            landed=position,
            to_offset=r.position,
            skipped_offsets=r.skipped,
            skipped_range=(
                f"{position}..{r.position - 1}" if r.skipped and position is not None and r.position else None
            ),
            replayed_offsets=r.replayed,
            replayed_range=f"{r.position}..{r.replay.end}" if r.replay is not None else None,
            replay_id=rec.replay_id,
            made=rec.created,
        )
        return r.position, r.incarnation

    # -- operations ------------------------------------------------------------------------------

    async def reload(self, config: MqdConfig) -> None:
        """Apply a new config: topics and consumer thresholds, landing thresholds/compression."""
        if (config.landing.table, config.landing.delta) != (
            self._config.landing.table,
            self._config.landing.delta,
        ):
            raise ValueError("landing.table and [landing.delta] cannot change on reload; restart the daemon")
        self.sink.reconfigure(config.landing)  # refuses a new landing dir before anything changes
        self.consumer.update_config(_consumer_config(config))
        self._config = config
        log.info("config reloaded")

    def pause(self, tps: Iterable[Any]) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        self._user_paused.update(tps)
        self.consumer.pause(tps)

    def resume(self, tps: Iterable[Any]) -> None:
        tps = [TopicPartition(*tp) for tp in tps]
        self._user_paused.difference_update(tps)
        self.consumer.resume([tp for tp in tps if tp not in self._disk_paused and tp not in self._broken])

    @property
    def stats(self) -> dict[str, Any]:
        s = self.sink.stats
        return {
            "records_published": s.records,
            "bytes_published": s.bytes,
            "files_published": s.files,
            "publish_conflicts": s.conflicts,
            "records_dropped": s.dropped,
            "records_cut": s.cut,
            "commits": self._commits,
            "markers": self._markers,
            "marker_lock_timeouts": self._marker_lock_timeouts,
            "reset_skipped_offsets": self._reset_skipped,
            "reset_replayed_offsets": self._reset_replayed,
            "chain_breaks": self._chain_breaks,  # partitions found with a broken claim chain
            # landing.lifecycle: files removed as committed by every query, and expired unread
            "lifecycle_files_deleted": 0
            if self._cleaner is None
            else self._cleaner.deleted + self._cleaner.archived,
            "lifecycle_files_expired": 0 if self._cleaner is None else self._cleaner.expired,
            # landing.table = "delta": commits to the landing table, files added, stale commits refused
            **(
                {}
                if self.table is None
                else {
                    "table_commits": self.table.stats.commits,
                    "table_files": self.table.stats.files,
                    "table_commits_dropped": self.table.stats.dropped,
                    "table_errors": self.table.stats.errors,
                }
            ),
        }

    def health(self) -> tuple[str, list[str]]:
        reasons: list[str] = []
        if self.state not in (DaemonState.RUNNING, DaemonState.STARTING):
            reasons.append(f"daemon {self.state}")
        if self._landing_error is not None:
            reasons.append(f"landing: {self._landing_error}")
        if self.table is not None and self.table.error is not None:
            reasons.append(f"landing table: {self.table.error}")
        reasons.extend(f"{tp}: {exc}" for tp, exc in sorted(self._broken.items()))
        try:
            snap: ConsumerSnapshot | None = self.consumer.snapshot()
        except Exception as exc:  # status must never take the endpoint down
            reasons.append(f"consumer status: {exc}")
            snap = None
        if snap is not None:
            reasons.extend(f"{what}: {err}" for what, err in snap.errors.items() if err)
            if snap.totals.parked:
                reasons.append(f"parked partitions: {', '.join(snap.totals.parked)}")
        waiting = self.consumer.waiting_reason()
        if waiting is not None:  # a start that is not up yet names its reason in `mqd status` too
            reasons.append(f"no assignment yet: {waiting}")
        return ("ok" if not reasons else "degraded"), reasons

    def snapshot(self) -> DaemonSnapshot:
        """The daemon at this instant, typed: what the runner reads (mqd/process/state.py)."""
        health, reasons = self.health()
        now = time.monotonic()
        return DaemonSnapshot(
            state=self.state,
            health=health,
            reasons=tuple(reasons),
            burst=self.burst,
            uptime_s=None if self._started_at is None else now - self._started_at,
            last_loop_age_s=now - self.last_loop_time,
            consumer=self.consumer.snapshot() if self.state != DaemonState.CREATED else None,
            landing_sink=self.sink.status(),
            landing_error=self._landing_error,
            paused_for_disk=tuple(sorted(f"{t}/{p}" for t, p in self._disk_paused)),
            chain_broken={f"{t}/{p}": exc.key for (t, p), exc in sorted(self._broken.items())},
            table=None if self.table is None else self.table.status(),
            user_paused=tuple(sorted(f"{t}/{p}" for t, p in self._user_paused)),
            subscribed_topics=tuple(self.consumer.subscribed_topics()),
            unmatched_patterns=tuple(self.consumer.unmatched_patterns()),
            stats=self.stats,
            errors=tuple(self._errors),
        )

    def status(self) -> dict[str, Any]:
        """The daemon's status JSON (the runner serves its own, from ``snapshot()``)."""
        return self.snapshot().status_json()

    def _record_error(self, where: str, exc: BaseException) -> None:
        self._errors.append(
            {
                "where": where,
                "error": f"{type(exc).__name__}: {exc}",
                "retriable": getattr(exc, "retriable", None),
                "at": layout.iso_now(),
            }
        )
