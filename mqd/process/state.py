"""The states of the process's two layers, typed (issue 32): the daemon's lifecycle and the
runner's, which the admin endpoint, the status page and the ``mqd_daemon_state`` gauge report.

Both are ``StrEnum``: a state is its own name in JSON, in a log line and as a metric label, so the
status a tool reads did not change shape when the strings became types.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DaemonState", "RunnerState"]


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
