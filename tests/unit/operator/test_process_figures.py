"""The ``process`` section of /status reads this process's figures, with psutil imported on the
first request rather than with the endpoint."""

from __future__ import annotations

import os

from mqd.operator.admin import ProcessFigures


def test_process_figures_are_this_processs_pid_rss_and_cpu() -> None:
    """Two requests in a row: the pid, a positive RSS and CPU seconds that do not go backwards."""
    figures = ProcessFigures()
    first, second = figures.status(), figures.status()
    assert first["pid"] == second["pid"] == os.getpid()
    assert isinstance(first["rss_bytes"], int) and first["rss_bytes"] > 0
    assert 0 <= first["cpu_seconds"] <= second["cpu_seconds"]
