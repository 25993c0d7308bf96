"""The chaos run across many hosts (``python -m mqd_dev.chaos --topology hosts``, ``make chaos
TOPOLOGY=hosts``, issue 33): :class:`mqd.testing.hosts.HostRig` under load, one fault by host per
round, the same ledger end check as every chaos run.

The rig: three Apache Kafka brokers (every one a KRaft voter; the topic replicated 3 times,
``min.insync.replicas`` 2, acks=all), SeaweedFS, three ``mqd run`` daemons in one group (static
membership, 3 s sessions), a Spark standalone master and two workers, each on a network host of its
own; the run itself (load, checks) is on the bridge and never faulted. mqd's fault proxy sits on
every daemon -> broker and daemon -> S3 link from the start, transparent until a ``link_delay``
round.

Fault kinds (:data:`HOST_KINDS`), one per round for a hold drawn in ``[hold_min, hold_max]`` (those
whose point is a lost session last past it):

- ``coordinator_cut``: a daemon and the group coordinator's host cut apart (that pair only: the
  daemon still reaches S3 and the other brokers): a zombie the claim chain must fence.
- ``s3_cut``: a daemon and the S3 host cut apart (it still reaches Kafka).
- ``daemon_isolate``: a daemon host cut from everyone.
- ``broker_isolate``: a Kafka host cut from everyone (its leaderships move; it catches up after).
- ``asymmetric_loss``: 30 % of what a daemon host sends to a broker or to S3 dropped, nothing of
  what comes back.
- ``link_delay``: a daemon's links to S3 and to every broker slowed through the proxy (0.1-0.3 s
  per answer chunk).
- ``daemon_kill`` / ``daemon_freeze``: a daemon host's processes SIGKILLed (restarted after the
  hold) or SIGSTOPped past its session (then SIGCONT).
- ``broker_kill``: a Kafka host's broker SIGKILLed, started again on its data after the hold.
- ``s3_kill``: the S3 host's ``weed`` SIGKILLed, started again on its data.
- ``group_restart``: every daemon host SIGKILLed at once, all started again.
- ``clock_step``: a daemon's host clock stepped by +10 or -10 min (libfaketime) and the daemon
  restarted so; put back at the end of the round.

Each round's recovery time: from the fault's end until every partition has landed what was
acknowledged when it ended and more since. The summary gives the worst per kind. At the end the
load stops, every fault is lifted, the daemons land the whole log, and the landing (read from S3)
and the Delta table that ``mqd spark --once`` writes on the Spark cluster (read by delta-rs, not
Spark) must each hold every acknowledged record once, at its offset; the landing must equal
Kafka's log offset by offset.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from mqd.testing.hosts import HostRig
from mqd.testing.hosts_net import NetHost
from mqd.testing.hosts_services import KAFKA_PORT
from mqd.waiting import wait_until
from mqd_dev.chaos import check
from mqd_dev.chaos.kafka_source import KafkaLoad, read_kafka_log
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.proxy import FaultProxy, Faults

log = structlog.get_logger("mqd.chaos")

HOST_KINDS = (
    "coordinator_cut",
    "s3_cut",
    "daemon_isolate",
    "broker_isolate",
    "asymmetric_loss",
    "link_delay",
    "daemon_kill",
    "daemon_freeze",
    "broker_kill",
    "s3_kill",
    "group_restart",
    "clock_step",
)
SESSION_S = 3.0
# kinds whose point is a session lost (a zombie, a handover): held past it
_PAST_SESSION = frozenset({"coordinator_cut", "daemon_isolate", "daemon_freeze"})
_LOSS = 0.3
_WAIT = 90.0  # one step: a JVM start, a fence, a catch-up on a loaded 2-core machine


@dataclass
class HostsOptions:
    root: Path
    seed: int
    rounds: int = 20
    partitions: int = 6
    hold_min: float = 2.0
    hold_max: float = 5.0
    batch_records: int = 20
    produce_interval: float = 0.2
    kinds: tuple[str, ...] = HOST_KINDS
    spark: bool = True
    settle_timeout: float = 180.0
    spark_timeout: float = 1500.0

    def validate(self) -> None:
        unknown = set(self.kinds) - set(HOST_KINDS)
        if unknown:
            raise ValueError(
                f"unknown fault kinds for --topology hosts: {sorted(unknown)}; known: {HOST_KINDS}"
            )
        if not self.kinds:
            raise ValueError("no fault kinds to draw from")
        if not 0 < self.hold_min <= self.hold_max:
            raise ValueError("hold_min must be > 0 and <= hold_max")


@dataclass
class HostRound:
    number: int
    kind: str
    target: str
    hold_s: float
    recovery_s: float | None = None
    notes: list[str] = field(default_factory=list)


class HostsChaosRun:
    """Build in __init__; ``await run()`` does everything and always cleans up."""

    def __init__(self, options: HostsOptions) -> None:
        options.validate()
        self.opts = options
        self.root = options.root.resolve()
        self.rng = random.Random(options.seed)
        self.rig = HostRig(
            self.root / "rig",
            partitions=options.partitions,
            session_timeout=SESSION_S,
            spark_workers=2 if options.spark else 0,
            # files of 5 s, not the rig's half second: the end check's mqd spark --once on the two
            # workers reads a few landed files a second at load 20 (a 20-round run of half-second
            # files did not finish in 10 min); a round's recovery includes up to one file's age
            daemon_settings={"landing": {"max_age": 5.0}},
        )
        self.ledger = Ledger(self.root / "ledger.tsv")
        self.load: KafkaLoad | None = None
        self.rounds: list[HostRound] = []
        self.failures: list[str] = []
        self.crashes: Counter[str] = Counter()
        self.proxies: dict[tuple[str, str], FaultProxy] = {}  # (daemon host, target host) -> proxy
        self._supervisor: asyncio.Task[None] | None = None
        self._started = 0.0

    # -- set-up ------------------------------------------------------------------------------------

    async def _setup(self) -> None:
        await asyncio.to_thread(self.rig.start)
        rig = self.rig
        assert rig.kafka is not None and rig.s3 is not None
        for i in range(len(rig.daemons)):
            d = rig.host(f"d{i}")
            for k in rig.kafka.hosts:
                self.proxies[(d.name, k.name)] = rig.net.proxy(k, KAFKA_PORT, source=d, seed=self.opts.seed)
            s3 = rig.net.proxy(rig.host("s3"), rig.s3.s3_port, source=d, seed=self.opts.seed)
            self.proxies[(d.name, "s3")] = s3
        self.load = KafkaLoad(
            rig.bootstrap,
            rig.topic,
            self.opts.partitions,
            batch_records=self.opts.batch_records,
            interval=self.opts.produce_interval,
            ledger=self.ledger,
        )
        await asyncio.to_thread(rig.start_daemons)
        self._supervisor = asyncio.create_task(self._supervise())
        self.load.start()
        await wait_until(lambda: self.load is not None and self.load.acknowledged > 0, 60, "the first ack")
        await self._caught_up(self._acked(), _WAIT, "the daemons to start landing")

    async def _supervise(self) -> None:
        """Restart a daemon that exits unasked (systemd's Restart=on-failure); counted as a crash."""
        while True:
            await asyncio.sleep(0.5)
            for i, d in enumerate(self.rig.daemons):
                code = d.unasked_exit()
                if code is not None:
                    self.crashes[d.name] += 1
                    self.failures.append(f"daemon {d.name} exited by itself with {code}:\n{d.tail(20)}")
                    await asyncio.to_thread(self.rig.restart_daemon, i)

    def _acked(self) -> dict[int, int]:
        assert self.load is not None
        self.load.drain_reports()
        return dict(self.load.acked_end)

    async def _caught_up(
        self, target: dict[int, int], timeout: float, what: str, *, beyond: bool = False
    ) -> float:
        started = time.monotonic()

        def done() -> bool:
            now = self.rig.landed_end()
            if not all(now[p] >= end for p, end in target.items()):
                return False
            return not beyond or any(now[p] > end for p, end in target.items())

        await wait_until(lambda: asyncio.to_thread(done), timeout, what, interval=0.2)
        return time.monotonic() - started

    # -- faults ------------------------------------------------------------------------------------

    def _daemon_host(self) -> NetHost:
        return self.rig.host(f"d{self.rng.randrange(len(self.rig.daemons))}")

    def _broker(self) -> int:
        assert self.rig.kafka is not None
        return self.rng.randrange(len(self.rig.kafka.hosts))

    async def _in_sync(self, timeout: float = _WAIT) -> None:
        kafka = self.rig.kafka
        assert kafka is not None

        def all_in_sync() -> bool:
            return all(
                len(kafka.in_sync_replicas(self.rig.topic, p, timeout=2.0) or []) == 3
                for p in range(self.opts.partitions)
            )

        await wait_until(
            lambda: asyncio.to_thread(all_in_sync), timeout, "every replica in sync", interval=0.5
        )

    async def _fault(self, kind: str, hold: float, rec: HostRound) -> None:
        """Inject ``kind`` for ``hold`` seconds and lift it (the round's recovery is timed after)."""
        rig = self.rig
        kafka = rig.kafka
        assert kafka is not None
        if kind == "coordinator_cut":
            d = self._daemon_host()
            coordinator = await asyncio.to_thread(rig.coordinator_host)
            rec.target = f"{d.name}<->{coordinator.name}"
            d.cut(coordinator)
            await asyncio.sleep(hold)
            d.heal()
        elif kind == "s3_cut":
            d = self._daemon_host()
            rec.target = f"{d.name}<->s3"
            d.cut(rig.host("s3"))
            await asyncio.sleep(hold)
            d.heal()
        elif kind == "daemon_isolate":
            d = self._daemon_host()
            rec.target = d.name
            d.isolate()
            await asyncio.sleep(hold)
            d.heal()
        elif kind == "broker_isolate":
            await self._in_sync()
            k = kafka.hosts[self._broker()]
            rec.target = k.name
            k.isolate()
            await asyncio.sleep(hold)
            k.heal()
        elif kind == "asymmetric_loss":
            d = self._daemon_host()
            peer = self.rng.choice([*kafka.hosts, rig.host("s3")])
            rec.target = f"{d.name}->{peer.name} {_LOSS:.0%}"
            d.loss(peer, _LOSS)
            await asyncio.sleep(hold)
            d.loss(peer, 0.0)
        elif kind == "link_delay":
            d = self._daemon_host()
            rec.target = d.name
            mine = [p for (src, _), p in self.proxies.items() if src == d.name]
            for p in mine:
                p.faults = Faults(delay=1.0, delay_s=0.2)
            await asyncio.sleep(hold)
            for p in mine:
                p.clear()
            rec.notes.append(f"delayed answer chunks: {sum(p.stats.injected.get('delay', 0) for p in mine)}")
        elif kind == "daemon_kill":
            i = self.rng.randrange(len(rig.daemons))
            rec.target = f"d{i}"
            rig.host(f"d{i}").kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(rig.restart_daemon, i)
        elif kind == "daemon_freeze":
            d = self._daemon_host()
            rec.target = d.name
            d.freeze()
            await asyncio.sleep(hold)
            d.thaw()
        elif kind == "broker_kill":
            await self._in_sync()
            i = self._broker()
            rec.target = f"k{i}"
            kafka.hosts[i].kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(kafka.start_broker, i, _WAIT)
        elif kind == "s3_kill":
            rec.target = "s3"
            rig.host("s3").kill()
            await asyncio.sleep(hold)
            assert rig.s3 is not None
            await asyncio.to_thread(rig.s3.restart)
        elif kind == "group_restart":
            rec.target = "d*"
            for i in range(len(rig.daemons)):
                rig.host(f"d{i}").kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(rig.start_daemons)
        elif kind == "clock_step":
            i = self.rng.randrange(len(rig.daemons))
            step = self.rng.choice([600, -600])
            rec.target = f"d{i} {step:+d}s"
            h = rig.host(f"d{i}")
            h.step_clock(step)
            await asyncio.to_thread(rig.restart_daemon, i)
            await asyncio.sleep(hold)
            h.step_clock(0)
            await asyncio.to_thread(rig.restart_daemon, i)
        else:  # validate() refused it
            raise ValueError(kind)

    async def _round(self, number: int) -> HostRound:
        kind = self.rng.choice(self.opts.kinds)
        hold = round(self.rng.uniform(self.opts.hold_min, self.opts.hold_max), 2)
        if kind in _PAST_SESSION:
            hold = max(hold, SESSION_S * 1.5 + 0.5)
        rec = HostRound(number, kind, "", hold)
        self.rounds.append(rec)
        log.info("chaos.round", round=number, kind=kind, hold=hold)
        try:
            await self._fault(kind, hold, rec)
            mark = self._acked()
            rec.recovery_s = round(
                await self._caught_up(mark, _WAIT, f"round {number} ({kind}) to recover", beyond=True), 2
            )
        except Exception as exc:  # the run goes on after a fault that did not recover: reported
            self.failures.append(f"round {number} ({kind} {rec.target}): {type(exc).__name__}: {exc}")
            self.rig.heal()
        log.info("chaos.round_done", round=number, kind=kind, target=rec.target, recovery_s=rec.recovery_s)
        return rec

    # -- the end -----------------------------------------------------------------------------------

    async def _settle_and_check(self) -> dict[str, Any]:
        rig = self.rig
        assert self.load is not None and rig.kafka is not None
        await self.load.stop()
        rig.heal()
        for p in self.proxies.values():
            p.clear()
        out: dict[str, Any] = {}
        try:
            await self._in_sync(_WAIT * 2)
        except TimeoutError as exc:
            self.failures.append(f"the brokers did not come back in sync: {exc}")
        acked = self._acked()
        try:
            out["catch_up_s"] = round(
                await self._caught_up(acked, self.opts.settle_timeout, "the whole log"), 1
            )
        except TimeoutError as exc:
            self.failures.append(f"final catch-up: {exc}; landed {rig.landed_end()}, acknowledged {acked}")
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
            self._supervisor = None
        codes = {}
        for i, d in enumerate(rig.daemons):
            codes[d.name] = await asyncio.to_thread(rig.stop_daemon, i)
            if codes[d.name] != 0:
                self.failures.append(f"daemon {d.name} exited with {codes[d.name]} on SIGTERM:\n{d.tail(20)}")
        out["daemon_exit_codes"] = codes
        self.ledger.close()
        ledger = await asyncio.to_thread(read_ledger, self.ledger.path)
        log_tables = await asyncio.to_thread(read_kafka_log, rig.bootstrap, rig.topic, acked)
        landing = await asyncio.to_thread(rig.read_landing)
        landed = check.check_payloads(ledger, landing)
        vs_log = check.compare(log_tables, landing)
        out["landing"] = landed.to_json()
        out["landing_vs_log"] = vs_log.to_json()
        if not landed.ok:
            self.failures.append(f"landing vs the producer's ledger: {landed.examples}")
        if not vs_log.ok:
            self.failures.append(f"landing vs Kafka's log: {vs_log.examples}")
        out["table"] = await self._spark_check(ledger) if self.opts.spark else {"skipped": "--no-spark"}
        return out

    async def _spark_check(self, ledger: Any) -> dict[str, Any]:
        """``mqd spark --once`` on the standalone cluster, then the table (delta-rs) vs the ledger."""
        started = time.monotonic()
        driver = self.rig.spark_driver("--once")
        driver.start()
        try:
            code = await asyncio.to_thread(driver.wait, self.opts.spark_timeout)
        except TimeoutError:
            driver.kill_now()
            self.failures.append(f"mqd spark --once did not finish in {self.opts.spark_timeout}s")
            return {"error": "timeout"}
        if code != 0:
            self.failures.append(f"mqd spark --once exited with {code}:\n{driver.tail(30)}")
            return {"error": f"exit {code}"}
        table = await asyncio.to_thread(check.read_table_output, self.rig.table_path(), self.rig.topic)
        res = check.check_payloads(ledger, table)
        if not res.ok:
            self.failures.append(f"table vs the producer's ledger: {res.examples}")
        return {**res.to_json(), "spark_s": round(time.monotonic() - started, 1)}

    # -- the run -----------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self._started = time.monotonic()
        result: dict[str, Any] = {}
        try:
            await self._setup()
            for i in range(1, self.opts.rounds + 1):
                await self._round(i)
            result = await self._settle_and_check()
        except Exception as exc:  # a failed run still ends in a summary and a clean machine
            log.exception("chaos.run_aborted")
            self.failures.append(f"run aborted: {type(exc).__name__}: {exc}")
        finally:
            if self._supervisor is not None:
                self._supervisor.cancel()
                await asyncio.gather(self._supervisor, return_exceptions=True)
            if self.load is not None:
                await self.load.stop(timeout=5.0)
            self.ledger.close()
            await asyncio.to_thread(self.rig.close)
        return self.summary(result)

    def summary(self, result: dict[str, Any]) -> dict[str, Any]:
        worst: dict[str, float] = {}
        for r in self.rounds:
            if r.recovery_s is not None:
                worst[r.kind] = max(worst.get(r.kind, 0.0), r.recovery_s)
        landing = result.get("landing", {})
        return {
            "ok": not self.failures,
            "seed": self.opts.seed,
            "topology": "hosts: k0-k2 (Apache Kafka), s3 (SeaweedFS), d0-d2 (mqd run), spark + w0-w1",
            "rounds": len(self.rounds),
            "faults": dict(sorted(Counter(r.kind for r in self.rounds).items())),
            "acknowledged": self.load.acknowledged if self.load is not None else 0,
            "landing": landing,
            "landing_vs_log": result.get("landing_vs_log", {}),
            "table": result.get("table", {}),
            "max_recovery_s_by_kind": dict(sorted(worst.items())),
            "catch_up_s": result.get("catch_up_s"),
            "crashes": dict(self.crashes),
            "produce_errors": dict(self.load.errors) if self.load is not None else {},
            "duration_s": round(time.monotonic() - self._started, 1),
            "round_log": [asdict(r) for r in self.rounds],
            "failures": self.failures,
        }


def format_hosts_summary(s: dict[str, Any]) -> str:
    def copy(name: str, c: dict[str, Any]) -> str:
        if "distinct" not in c:
            return f"{name}: {c or 'not checked'}"
        return (
            f"{name}: acknowledged {c['acknowledged']}, distinct {c['distinct']}, lost {c['lost']}, "
            f"duplicated {c['duplicates']}, at another offset {c['moved']}, foreign {c['foreign']}"
        )

    vs_log = s.get("landing_vs_log") or {}
    lines = [
        f"chaos (hosts) {'PASSED' if s['ok'] else 'FAILED'}: seed {s['seed']}, {s['rounds']} rounds, "
        f"{s['duration_s']}s",
        f"topology: {s['topology']}",
        "faults: " + ", ".join(f"{k} {v}" for k, v in s["faults"].items()),
        copy("landing", s.get("landing") or {}),
        f"landing vs Kafka's log: lost {vs_log.get('lost')}, duplicated {vs_log.get('duplicates')}, "
        f"mismatched {vs_log.get('mismatched')}, not in the log {vs_log.get('not_in_log')}",
        copy("table (delta-rs)", s.get("table") or {}),
        "worst recovery by kind: " + ", ".join(f"{k} {v}s" for k, v in s["max_recovery_s_by_kind"].items()),
        f"final catch-up: {s.get('catch_up_s')}s; crashes: {s['crashes'] or 'none'}",
    ]
    lines.extend(f"FAILURE: {f}" for f in s["failures"])
    return "\n".join(lines)


def hosts_main(args: Any, seed: int, root: Path) -> int:
    """``--topology hosts`` from the chaos CLI: run, print the summary, write its JSON; the exit
    code (0 passed, 1 failed, 2 bad arguments)."""
    import shutil
    import sys
    import tempfile

    from mqd.testing.hosts_net import missing_requirements

    missing = missing_requirements(clock=True)
    if missing:
        print("error: --topology hosts needs " + ", ".join(missing), file=sys.stderr)
        return 2
    kinds = HOST_KINDS if args.kinds == "all" else tuple(k for k in args.kinds.split(",") if k)
    try:
        options = HostsOptions(
            root=root,
            seed=seed,
            rounds=args.rounds,
            hold_min=args.hold_min,
            hold_max=args.hold_max,
            kinds=kinds,
            spark=not args.no_spark,
        )
        options.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"chaos: seed {seed}, {args.rounds} rounds, topology hosts, work dir {root}", flush=True)
    summary = asyncio.run(HostsChaosRun(options).run())
    out = args.out or Path(tempfile.gettempdir()) / f"mqd-chaos-hosts-{seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(format_hosts_summary(summary), flush=True)
    print(f"summary JSON: {out}", flush=True)
    if summary["ok"] and not args.keep and args.root is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if summary["ok"] else 1
