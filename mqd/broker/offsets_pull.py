"""Master side of committed-offset replication: max-merge the slaves' offsets into the master's.

While a master is down a slave can be its consumer groups' coordinator and take commits. So a
master pulls every live slave's ``GET /v1/replica/offsets`` once when it starts, before it listens
(waiting at most a short timeout), and then every second, and max-merges them
(:meth:`ConsumerGroupStore.merge`). The slave side (pulling the master's) is in replication.py.
"""

from __future__ import annotations

import asyncio

import structlog

from mqd.broker.cluster_state import ClusterState
from mqd.broker.consumer_groups import ConsumerGroupError, ConsumerGroupStore
from mqd.broker.replica_client import ReplicaClient
from mqd.wire.client import BrokerError

log = structlog.get_logger(__name__)

OFFSETS_PULL_INTERVAL_S = 1.0  # a master pulls its slaves' committed offsets this often
OFFSETS_PULL_START_TIMEOUT_S = 2.0  # ... and once at start, before it serves, waiting at most this


class SlaveOffsetsPull:
    """Pulls and max-merges the committed offsets of a master's live slaves."""

    def __init__(
        self,
        state: ClusterState,
        client: ReplicaClient,
        consumer_groups: ConsumerGroupStore,
        *,
        timeout_s: float,
        interval_s: float = OFFSETS_PULL_INTERVAL_S,
    ) -> None:
        self._state = state
        self._client = client
        self._consumer_groups = consumer_groups
        self._timeout_s = timeout_s
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Pull once (bounded by OFFSETS_PULL_START_TIMEOUT_S), then every interval."""
        if self._task is not None:
            return
        await self.pull_once(OFFSETS_PULL_START_TIMEOUT_S)
        self._task = asyncio.create_task(self._loop(), name="offsets-pull")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.pull_once(self._timeout_s)
            except Exception:
                log.exception("pulling committed offsets from slaves failed")

    async def pull_once(self, timeout: float) -> None:
        """Max-merge the committed offsets of every live slave into this master's store."""
        slaves = self._state.live_slaves()
        answers = await asyncio.gather(
            *(self._client.offsets(s, timeout=timeout) for s in slaves), return_exceptions=True
        )
        for slave, answer in zip(slaves, answers, strict=True):
            if isinstance(answer, BrokerError):
                log.debug("cannot pull committed offsets from slave", slave=slave.id, error=str(answer))
                continue
            if isinstance(answer, BaseException):
                raise answer
            try:
                if await self._consumer_groups.merge(answer):
                    log.info("merged committed offsets from slave", slave=slave.id)
            except ValueError as exc:
                log.error("malformed committed offsets from slave", slave=slave.id, error=str(exc))
            except ConsumerGroupError as exc:
                log.error("cannot store committed offsets merged from slave", slave=slave.id, error=str(exc))
