"""Apache Kafka for the Kafka chaos run (``--source kafka``, issue 28): three brokers behind fault proxies.

The cluster (:class:`mqd.testing.KafkaCluster`, Apache Kafka 4.4, KRaft) has four nodes: node 0 is
the quorum's only controller (a combined node, so KafkaCluster can wait for it as for any broker;
it hosts no partition of the chaos topic and is never faulted), nodes 1-3 are the three brokers
that hold the chaos topic, replication factor 3, ``min.insync.replicas=2``. Why a controller of its
own: an unclean election needs two of a partition's three replicas down at once while the third
comes back, and three combined voters lose their quorum with two of them down (no fencing, no ISR
change, no election: the cluster just stops).

The proxies: a Kafka client bootstraps from one address and then connects to the addresses the
metadata advertises, so a proxy in front of the bootstrap address alone would see only the first
requests. Every node has a second listener, ``CLIENT`` (PLAINTEXT) on a private port, advertised
as the address of that node's own :class:`FaultProxy`; the daemons and the producer bootstrap from
the proxies, so every connection they make crosses one. The brokers replicate, and the harness
reads and administers, over the ``PLAINTEXT`` listener directly: a network fault is between the
clients and the brokers, as for Tansu, and never splits the cluster itself.

Broker fault kinds (``APACHE_KAFKA_CATEGORIES["broker"]``), one per round, each beginning once every
partition has its three replicas in sync again (a fault is then never a compound of the last one):

- ``kafka_broker_kill``: a broker SIGKILLed, started again on its data after the hold.
- ``kafka_leader_kill``: the leader of a partition the daemons read SIGKILLed; the run waits for the
  controller to move the leadership (the broker session is 3 s), then starts it again.
- ``kafka_broker_freeze``: a broker SIGSTOPped past its session (fenced, its leaderships move;
  its connections stay open and silent), then SIGCONT.
- ``kafka_unclean_election``: the sequence of the unclean-election test on a chaos partition: its
  followers T then X are killed (T first, so records are acknowledged without it: T is stale; then
  X, so the ISR shrinks to the leader L and acks=all writes are refused), then L; X is started and
  elected leader by an unclean election (ElectLeaders UNCLEAN: X is outside the ISR, which is [L])
  and then L and T, which truncate to X's log. X was in the ISR until it shrank below
  ``min.insync.replicas``, so X holds every acknowledged record: what the election drops is only
  what L appended alone and never acknowledged (and what a daemon may have read of it from L: its
  offsets are reused, a new incarnation). Kafka guarantees that, so the run requires it: an
  acknowledged record missing from the log is a failure (:data:`BROKER_MAY_LOSE`). Electing T
  instead would lose records Kafka acknowledged: Kafka does not promise to keep them then, and no
  fault here does it.

The consumer group protocol (``--group-protocol consumer``, KIP-848): the daemons join with
``consumer.kafka.group_protocol = "consumer"`` and the brokers' coordinator runs the assignor. Its
session and heartbeat are the broker's (:func:`consumer_group_settings`): a session of
:data:`GROUP_SESSION_S`, longer than the daemons' own (3 s: a member cut off stops owning before the
coordinator hands its partitions on), so that a killed or frozen daemon's partitions move within
seconds, not Kafka's default 45 s.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from mqd.testing.cluster import free_port
from mqd.testing.kafka_cluster import KafkaCluster
from mqd_dev.chaos.proxy import FaultProxy, Faults

log = structlog.get_logger("mqd.chaos")

CONTROLLER = 0  # node 0: the quorum's only voter; hosts no chaos partition, never faulted
MIN_INSYNC = 2
REPLICATION = 3
BROKER_SESSION_S = 3.0  # KafkaCluster's broker.session.timeout.ms: a dead broker is fenced after it
# an acknowledged record missing from Apache Kafka's log fails the run: every broker fault here stays
# inside Kafka's guarantee for acks=all with min.insync.replicas=2 (see the module docstring)
BROKER_MAY_LOSE = False
# KIP-848 groups (--group-protocol consumer): the coordinator's session for a member (Kafka's
# default 45 s, its floor 45 s unless lowered), above the daemons' session_timeout (3 s)
GROUP_SESSION_S = 5.0
GROUP_HEARTBEAT_S = 0.5
GROUP_PROTOCOLS = ("classic", "consumer")
_WAIT = 45.0  # one step of a broker fault (a fence, an election, a JVM start on a loaded machine)


def data_brokers(brokers: int = REPLICATION) -> list[int]:
    """The nodes that hold the chaos topic (node 0 is the controller)."""
    return list(range(1, brokers + 1))


def replica_assignment(partitions: int, brokers: Sequence[int]) -> list[list[int]]:
    """Every partition on every one of ``brokers``, the preferred leader rotating (partition p led
    by ``brokers[p % n]``), so each broker leads some partition the daemons read."""
    n = len(brokers)
    return [[brokers[(p + i) % n] for i in range(n)] for p in range(partitions)]


def consumer_group_settings(group_protocol: str) -> dict[str, str]:
    """The brokers' settings for ``group_protocol``: none for classic (the daemons send their own
    session in JoinGroup); for ``consumer`` (KIP-848), the coordinator's session and heartbeat
    interval, and floors low enough to allow them (Kafka's are 45 s and 5 s)."""
    if group_protocol not in GROUP_PROTOCOLS:
        raise ValueError(f"group_protocol is classic or consumer, not {group_protocol!r}")
    if group_protocol == "classic":
        return {}
    return {
        "group.consumer.session.timeout.ms": str(int(GROUP_SESSION_S * 1000)),
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.heartbeat.interval.ms": str(int(GROUP_HEARTBEAT_S * 1000)),
        "group.consumer.min.heartbeat.interval.ms": "100",
    }


def client_listener_settings(
    port: int, client_port: int, proxy_port: int, controller_port: int | None
) -> dict[str, str]:
    """A node's listeners: ``PLAINTEXT`` on ``port`` (brokers, controller clients, the harness: no
    proxy), ``CLIENT`` on ``client_port`` advertised as ``proxy_port`` (what a client's metadata
    answer names when it asked on the CLIENT listener, i.e. through the proxy), and the controller's
    own listener when it is one. Overrides KafkaCluster's listener properties."""
    listeners = [f"PLAINTEXT://127.0.0.1:{port}", f"CLIENT://127.0.0.1:{client_port}"]
    if controller_port is not None:
        listeners.append(f"CONTROLLER://127.0.0.1:{controller_port}")
    return {
        "listeners": ",".join(listeners),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},CLIENT://127.0.0.1:{proxy_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    }


def unclean_roles(replicas: Sequence[int], leader: int, rng: random.Random) -> tuple[int, int]:
    """``(stale, elected)`` for ``kafka_unclean_election``: the two followers of ``leader``, in a
    seeded order. The stale one is killed first (records are acknowledged without it), the elected
    one second (it held every acknowledged record when the ISR shrank to the leader)."""
    followers = sorted(r for r in replicas if r != leader)
    if len(followers) != 2:
        raise ValueError(f"need a leader and two followers, got replicas {list(replicas)} led by {leader}")
    rng.shuffle(followers)
    return followers[0], followers[1]


async def _until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll the blocking ``check`` in a thread until it is truthy; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = await asyncio.to_thread(check)
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        await asyncio.sleep(interval)


class ApacheKafka:
    """Four Apache Kafka nodes (0: controller, 1-3: the chaos topic's brokers), a FaultProxy in front
    of each node's CLIENT listener. ``bootstrap``: the proxies (daemons, producer);
    ``check_bootstrap``: the PLAINTEXT listeners (the harness's reads and admin)."""

    kind = "apache"

    def __init__(
        self, root: Path, seed: int, brokers: int = REPLICATION, group_protocol: str = "classic"
    ) -> None:
        self.group_protocol = group_protocol
        self.cluster = KafkaCluster(
            root / "kafka",
            brokers + 1,
            controllers=1,
            settings={
                "unclean.leader.election.enable": "false",  # elections below are asked for
                **consumer_group_settings(group_protocol),
            },
        )
        self.data = data_brokers(brokers)
        self.client_ports = {b.index: free_port() for b in self.cluster.brokers}
        self.proxies = {
            b.index: FaultProxy(self.client_ports[b.index], free_port(), seed=seed + b.index)
            for b in self.cluster.brokers
        }
        for b in self.cluster.brokers:  # ports are picked: override the listeners before start()
            self.cluster.broker_settings[b.index] = client_listener_settings(
                b.port, self.client_ports[b.index], self.proxies[b.index].listen_port, b.controller_port
            )
        self.topic: str | None = None
        self.partitions = 0
        self.restarts: Counter[str] = Counter()
        self.elections: Counter[str] = Counter()  # unclean / by the controller (ELR) / none needed

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p.listen_port}" for p in self.proxies.values())

    @property
    def check_bootstrap(self) -> str:
        return self.cluster.bootstrap

    def describe(self) -> str:
        group = (
            f"consumer group protocol consumer (KIP-848, the broker's session {GROUP_SESSION_S:g} s)"
            if self.group_protocol == "consumer"
            else "consumer group protocol classic"
        )
        return (
            f"Apache Kafka {self.cluster.version}: brokers {self.data} (the topic: replication "
            f"{REPLICATION}, min.insync.replicas {MIN_INSYNC}), node {CONTROLLER} the KRaft controller; "
            f"clients through a proxy per node (advertised CLIENT listener); {group}"
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        for p in self.proxies.values():
            await p.start()
        await asyncio.to_thread(self.cluster.start)

    async def stop(self) -> None:
        await asyncio.to_thread(self.cluster.stop)
        for p in self.proxies.values():
            await p.stop()

    def kill_now(self) -> None:
        for b in self.cluster.brokers:
            b.kill_now()

    async def create_topic(self, topic: str, partitions: int, timeout: float = 30.0) -> None:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        self.topic, self.partitions = topic, partitions
        new = NewTopic(
            topic,
            partitions,
            replica_assignment=replica_assignment(partitions, self.data),
            config={"min.insync.replicas": str(MIN_INSYNC)},
        )
        for fut in self.cluster.admin().create_topics([new], operation_timeout=timeout).values():
            await asyncio.to_thread(fut.result, timeout)
        await self.wait_in_sync(timeout)

    # -- network faults (the clients' side) ----------------------------------------------------------

    def set_faults(self, faults: Faults) -> None:
        for p in self.proxies.values():
            p.faults = faults

    def clear_faults(self) -> None:
        for p in self.proxies.values():
            p.clear()

    def injected(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for p in self.proxies.values():
            out.update(p.stats.injected)
        return dict(sorted(out.items()))

    # -- state -------------------------------------------------------------------------------------

    def _partition(self, partition: int) -> Any:
        """The metadata of ``partition`` of the chaos topic (asked directly), None when unanswered."""
        from confluent_kafka import KafkaException

        assert self.topic is not None
        try:
            md = self.cluster.admin().list_topics(self.topic, timeout=2.0)
        except KafkaException:
            return None
        t = md.topics.get(self.topic)
        return t.partitions.get(partition) if t is not None and t.error is None else None

    def _isr(self, partition: int) -> list[int] | None:
        pm = self._partition(partition)
        return sorted(pm.isrs) if pm is not None else None

    def _leader(self, partition: int) -> int | None:
        pm = self._partition(partition)
        return pm.leader if pm is not None and pm.leader >= 0 else None

    def _leaderless(self, partition: int) -> bool:
        pm = self._partition(partition)
        return pm is not None and pm.leader < 0

    def _all_in_sync(self) -> bool:
        return all(self._isr(p) == self.data for p in range(self.partitions))

    async def wait_in_sync(self, timeout: float = _WAIT) -> None:
        await _until(self._all_in_sync, timeout, "every replica of the chaos topic in sync")

    def unasked_exits(self) -> list[tuple[int, int]]:
        """(node, exit code) of every node that exited unasked since the last call."""
        out = []
        for b in self.cluster.brokers:
            code = b.unasked_exit()
            if code is not None:
                out.append((b.index, code))
        return out

    async def start_node(self, i: int) -> None:
        await asyncio.to_thread(self.cluster.start_broker, i)
        self.restarts[f"kafka-{i}"] += 1

    async def restore(self) -> list[str]:
        """Every node running and thawed, the proxies transparent, every replica in sync (the end of
        the run); what had to be done."""
        notes = []
        self.clear_faults()
        for b in self.cluster.brokers:
            if b.frozen and b.running:
                b.send_signal(signal.SIGCONT)
                notes.append(f"kafka-{b.index} thawed")
            if not b.running:
                await self.start_node(b.index)
                notes.append(f"kafka-{b.index} started")
        await self.wait_in_sync(90.0)
        return notes

    # -- broker faults -----------------------------------------------------------------------------

    async def fault(self, kind: str, hold: float, notes: list[str], rng: random.Random) -> None:
        """Apply broker fault ``kind`` for ``hold`` seconds, then end it (every node back)."""
        try:
            await self.wait_in_sync()
        except TimeoutError:
            notes.append("the replicas were not all in sync at the fault's start")
        if kind == "kafka_broker_kill":
            await self._kill(rng.choice(self.data), hold, notes, "")
        elif kind == "kafka_leader_kill":
            p = rng.randrange(self.partitions)
            leader = await _until(lambda: self._leader(p), _WAIT, f"a leader of partition {p}")
            await self._kill(leader, hold, notes, f", the leader of partition {p}", moved_off=p)
        elif kind == "kafka_broker_freeze":
            i = rng.choice(self.data)
            b = self.cluster.brokers[i]
            notes.append(f"SIGSTOP kafka-{i} for {hold}s")
            self.cluster.freeze_broker(i)
            try:
                await asyncio.sleep(hold)
            finally:
                if b.running and b.frozen:
                    self.cluster.thaw_broker(i)
        elif kind == "kafka_unclean_election":
            await self._unclean_election(rng.randrange(self.partitions), hold, notes, rng)
        else:
            raise ValueError(f"unknown Apache Kafka fault kind {kind!r}")

    async def _kill(
        self, i: int, hold: float, notes: list[str], why: str, moved_off: int | None = None
    ) -> None:
        notes.append(f"SIGKILL kafka-{i}{why}, started again after {hold}s")
        started = time.monotonic()
        await asyncio.to_thread(self.cluster.kill_broker, i)
        try:
            if moved_off is not None:
                p = moved_off
                new = await _until(
                    lambda: (lambda x: x if x not in (None, i) else None)(self._leader(p)),
                    _WAIT,
                    f"partition {p}'s leadership to move off kafka-{i}",
                )
                notes.append(f"partition {p} led by kafka-{new} after {time.monotonic() - started:.1f}s")
            await asyncio.sleep(max(0.0, hold - (time.monotonic() - started)))
        finally:
            await self.start_node(i)

    async def _unclean_election(self, p: int, hold: float, notes: list[str], rng: random.Random) -> None:
        from confluent_kafka import ElectionType, KafkaException
        from confluent_kafka import TopicPartition as KafkaPartition

        assert self.topic is not None
        topic = self.topic
        leader = await _until(lambda: self._leader(p), _WAIT, f"a leader of partition {p}")
        stale, elected = unclean_roles(self.data, leader, rng)
        notes.append(
            f"unclean election on partition {p}: led by kafka-{leader}; kafka-{stale} killed (stale), "
            f"kafka-{elected} killed (the ISR shrinks to the leader), the leader killed, kafka-{elected} "
            "started and elected though outside the ISR, then the others"
        )
        dead: list[int] = []
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.cluster.kill_broker, stale)
            dead.append(stale)
            await _until(
                lambda: stale not in (self._isr(p) or [stale]), _WAIT, f"kafka-{stale} out of the ISR"
            )
            await asyncio.sleep(hold / 2)  # acknowledged (acks=all, ISR leader + elected) without it
            await asyncio.to_thread(self.cluster.kill_broker, elected)
            dead.append(elected)
            await _until(
                lambda: self._isr(p) == [leader], _WAIT, f"partition {p}'s ISR down to kafka-{leader}"
            )
            await asyncio.sleep(hold / 2)  # acks=all refused: min.insync.replicas is 2
            await asyncio.to_thread(self.cluster.kill_broker, leader)
            dead.append(leader)
            await _until(lambda: self._leaderless(p), _WAIT, f"partition {p} without a leader")
            await self.start_node(elected)
            dead.remove(elected)
            if await asyncio.to_thread(self._leader, p) == elected:
                how = "by the controller (an eligible replica, KIP-966)"
            else:
                election = self.cluster.admin().elect_leaders(
                    ElectionType.UNCLEAN, [KafkaPartition(topic, p)]
                )
                try:
                    result = await asyncio.to_thread(election.result, _WAIT)
                    for tp, err in (result or {}).items():
                        if err is not None:
                            raise RuntimeError(f"unclean election of {tp}: {err}")
                    how = "by an unclean election"
                except KafkaException as exc:
                    how = f"(the election answered {exc})"
            await _until(lambda: self._leader(p) == elected, _WAIT, f"kafka-{elected} to lead partition {p}")
            self.elections[how.split(" (")[0]] += 1
            notes.append(f"kafka-{elected} leads partition {p} {how}, {time.monotonic() - t0:.1f}s in")
        finally:
            for i in [leader, stale, elected]:
                if i in dead:
                    await self.start_node(i)
                    dead.remove(i)
        notes.append(f"every broker back {time.monotonic() - t0:.1f}s after the first kill")
