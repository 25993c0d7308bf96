"""One node's incremental fetch session (KIP-227), the client side.

The first request to a node is a full one (session id 0, epoch 0): it lists every partition and asks
the broker for a session. When the broker grants one (a non-zero id in the answer), the next requests
are incremental (that id, epoch 1, 2, ...): they list only the partitions whose fetch data (offset,
max bytes, leader epoch) differs from what the broker's session holds, plus newly added ones, and
name the partitions no longer wanted in ``forgotten_topics_data``. Kafka's broker keeps the last
fetch offset the client sent (it does not move it past what it answered), so a partition whose
position moved since the last request is sent again; what incremental requests leave out is the
idle partitions. The broker answers only the partitions with something new (records, bounds, an
error): the ones it leaves out are answered from the bounds last seen (``omitted``). Any session
error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR when
a session switched between topic ids and names), any other failed request and a
refused session reset it: the next request is full again. A broker that grants no session (id 0)
gets full requests every time, as without sessions.

What the session sent is observable without a broker's help (status, tests): the counters, the
session ids granted, and the last ``HISTORY`` requests as :class:`SentRequest` (id, epoch, full or
not, how many partitions it listed out of how many it fetched and, when incremental, which).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mqd.topic_partition import TopicPartition

INITIAL_EPOCH = 0  # with session id 0: a full request asking for a new session
NO_SESSION_EPOCH = -1  # FINAL_EPOCH with id 0: a full request without a session
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FETCH_SESSION_TOPIC_ID_ERROR = 106  # a session's topics named by id and by name (v13 and v12 mixed)
SESSION_ERRORS = frozenset(
    {FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR}
)
_MAX_EPOCH = 2**31 - 1
HISTORY = 64  # requests kept in FetchSession.history

# what the broker's session holds per partition: (fetch offset, max bytes, current leader epoch)
PartitionData = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What one request carries: ``send`` the partitions to list, ``forgotten`` the ones to drop."""

    session_id: int
    epoch: int
    full: bool
    send: list[TopicPartition]
    forgotten: list[TopicPartition]


@dataclass(frozen=True, slots=True)
class SentRequest:
    """One request as sent: it listed ``listed`` of the ``wanted`` partitions (all of them in a full
    request), ``changed`` names them in an incremental one (empty in a full one, which may be large),
    and ``forgotten`` partitions were dropped from the session."""

    session_id: int
    epoch: int
    full: bool
    listed: int
    wanted: int
    changed: tuple[TopicPartition, ...]
    forgotten: int


class FetchSession:
    """The client half of one node's session; not thread-safe (the node has one request in flight)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        self._held: dict[TopicPartition, PartitionData] = {}  # what the broker's session holds
        self._bounds: dict[TopicPartition, tuple[int, int, int]] = {}  # highwater, lso, log start
        self._wanted: dict[TopicPartition, PartitionData] = {}
        self.full_requests = 0
        self.incremental_requests = 0
        self.resets = 0
        self.partitions_listed = 0  # summed over every request: what sessions save
        self.granted: deque[int] = deque(maxlen=16)  # session ids the broker granted, oldest first
        self.history: deque[SentRequest] = deque(maxlen=HISTORY)

    def request(self, wanted: dict[TopicPartition, PartitionData]) -> SessionRequest:
        """The next request for ``wanted`` (every partition this round fetches, with its data)."""
        self._wanted = dict(wanted)
        if not self.enabled:
            self.full_requests += 1
            return self._sent(SessionRequest(0, NO_SESSION_EPOCH, True, list(wanted), []))
        if self.session_id == 0:
            self.full_requests += 1
            return self._sent(SessionRequest(0, INITIAL_EPOCH, True, list(wanted), []))
        self.incremental_requests += 1
        send = [tp for tp, data in wanted.items() if self._held.get(tp) != data]
        forgotten = [tp for tp in self._held if tp not in wanted]
        return self._sent(SessionRequest(self.session_id, self.epoch, False, send, forgotten))

    def _sent(self, req: SessionRequest) -> SessionRequest:
        self.partitions_listed += len(req.send)
        changed = () if req.full else tuple(req.send)
        listed, wanted, forgotten = len(req.send), len(self._wanted), len(req.forgotten)
        self.history.append(
            SentRequest(req.session_id, req.epoch, req.full, listed, wanted, changed, forgotten)
        )
        return req

    def answered(self, request: SessionRequest, session_id: int) -> None:
        """The broker answered ``request`` without a top-level error; ``session_id`` its id."""
        if not self.enabled:
            return
        if request.full:
            if session_id == 0:
                return  # no session granted: stay with full requests
            self.session_id, self.epoch = session_id, 1
            self.granted.append(session_id)
        else:
            self.epoch = 1 if self.epoch >= _MAX_EPOCH else self.epoch + 1
        self._held = dict(self._wanted)

    def bounds(self, tp: TopicPartition, highwater: int, lso: int, log_start: int) -> None:
        """Bounds a partition's answer carried, for the next answer that leaves it out."""
        self._bounds[tp] = (highwater, lso, log_start)

    def omitted(
        self, request: SessionRequest, answered: set[TopicPartition]
    ) -> dict[TopicPartition, tuple[int, int, int]]:
        """Partitions of the session this (incremental) answer left out: nothing new for them; each
        with the bounds last seen (-1 where none was)."""
        if request.full:
            return {}
        return {tp: self._bounds.get(tp, (-1, -1, -1)) for tp in self._wanted if tp not in answered}

    def reset(self) -> None:
        """Forget the session: the next request is full and asks for a new one."""
        if self.session_id:
            self.resets += 1
        self.session_id, self.epoch = 0, INITIAL_EPOCH
        self._held = {}
