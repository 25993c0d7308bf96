"""The states of the process's two layers, typed (issue 32): the daemon's lifecycle and the
runner's, which the admin endpoint, the status page and the ``mqd_daemon_state`` gauge report; and
``DaemonSnapshot``, what the runner reads of the daemon.

Both states are ``StrEnum``: a state is its own name in JSON, in a log line and as a metric label,
so the status a tool reads did not change shape when the strings became types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports the runner, and so this module, for the pid file helpers alone
    from mqd.consumer.snapshot import ConsumerSnapshot

__all__ = ["DaemonSnapshot", "DaemonState", "RunnerState"]


class DaemonState(StrEnum):
    """mqd.process.daemon.Daemon's lifecycle: built, then start() (which may fail), run, stop()."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class RunnerState(StrEnum):
    """mqd.process.runner.Runner's, what the process reports: a reload runs beside a running daemon."""

    STARTING = "starting"
    RUNNING = "running"
    RELOADING = "reloading"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class DaemonSnapshot:
    """The daemon at one instant, as the runner reads it (``Daemon.snapshot()``): its state and
    health typed, the rest as the parts that become the status JSON's sections.

    JSON only at the edge: ``sections_json()`` is the status JSON's daemon sections (from ``burst``
    to ``errors``, in their order), ``status_json()`` the daemon's own status (``Daemon.status()``);
    the runner puts its own state and health in front of the sections.
    """

    state: DaemonState
    health: str  # "ok" or "degraded"
    reasons: tuple[str, ...]  # why it is degraded
    burst: bool
    uptime_s: float | None  # since start() succeeded; None before
    last_loop_age_s: float  # since the working loop last turned
    consumer: ConsumerSnapshot | None  # None before start()
    landing_sink: Mapping[str, Any]  # the sink's own section (LandingSink.status())
    landing_error: str | None  # the landing is unwritable: fetching is paused until it is again
    paused_for_disk: tuple[str, ...]  # "topic/partition", paused while the landing is unwritable
    chain_broken: Mapping[str, str]  # "topic/partition" -> the key where its claim chain broke
    table: Mapping[str, Any] | None  # landing.table = "delta": the committer's section
    user_paused: tuple[str, ...]  # "topic/partition", paused by the operator
    subscribed_topics: tuple[str, ...]  # concrete topics, re: patterns resolved
    unmatched_patterns: tuple[str, ...]  # patterns matching no topic (a warning)
    stats: Mapping[str, int]  # the counters (Daemon.stats)
    errors: tuple[Mapping[str, Any], ...]  # the latest errors, oldest first

    def sections_json(self) -> dict[str, Any]:
        """The status JSON's daemon sections, after its ``state`` and ``health``."""
        from mqd.consumer.snapshot import consumer_status_json

        return {
            "burst": self.burst,
            "uptime_s": None if self.uptime_s is None else round(self.uptime_s, 3),
            "last_loop_age_s": round(self.last_loop_age_s, 3),
            "consumer": None if self.consumer is None else consumer_status_json(self.consumer),
            "landing": {
                **self.landing_sink,
                "error": self.landing_error,
                "paused_for_disk": list(self.paused_for_disk),
                "chain_broken": dict(self.chain_broken),
                "table": None if self.table is None else dict(self.table),
            },
            "user_paused": list(self.user_paused),
            "subscription": {
                "topics": list(self.subscribed_topics),
                "unmatched_patterns": list(self.unmatched_patterns),
            },
            "stats": dict(self.stats),
            "errors": [dict(e) for e in self.errors],
        }

    def status_json(self) -> dict[str, Any]:
        """The daemon's own status (``Daemon.status()``): its state and health, then the sections."""
        return {
            "state": self.state,
            "health": self.health,
            "reasons": list(self.reasons),
            **self.sections_json(),
        }
