"""Real servers as pytest fixtures: one helper for what every server fixture does around its yield."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

import pytest


class Server(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def dump_logs(self) -> str: ...


S = TypeVar("S", bound=Server)


@contextlib.contextmanager
def serving(request: pytest.FixtureRequest, server: S) -> Iterator[S]:
    """``server`` started for the fixture's scope and stopped after it; its log printed to stderr at
    teardown when a test of that scope failed meanwhile (pytest shows it with the failure)."""
    failed_before = request.session.testsfailed
    server.start()
    try:
        yield server
    finally:
        server.stop()
        if request.session.testsfailed > failed_before:
            print(server.dump_logs(), file=sys.stderr)
