"""sd_notify messages, captured on a real datagram socket (file path and abstract @ addresses)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqd.process.sdnotify import Notifier, format_message, monotonic_usec, socket_address


def _fields(payload: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in payload.decode().split("\n"))


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


@pytest.fixture
def abstract_socket() -> Iterator[tuple[socket.socket, str]]:
    name = f"mqd-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    yield sock, "@" + name
    sock.close()


def test_path_socket_gets_ready_status_and_stopping(path_socket: tuple[socket.socket, str]) -> None:
    """READY carries STATUS and MAINPID; STOPPING arrives as its own datagram, in order."""
    sock, path = path_socket
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("consuming 4 partitions")
    assert n.stopping("draining")
    first = _fields(sock.recv(4096))
    assert first == {"READY": "1", "STATUS": "consuming 4 partitions", "MAINPID": str(os.getpid())}
    assert _fields(sock.recv(4096)) == {"STOPPING": "1", "STATUS": "draining"}
    n.close()
    n.close()  # idempotent


def test_abstract_socket_gets_reloading_with_monotonic_usec(
    abstract_socket: tuple[socket.socket, str],
) -> None:
    """An @name address reaches the abstract namespace; RELOADING carries a current CLOCK_MONOTONIC."""
    sock, name = abstract_socket
    n = Notifier({"NOTIFY_SOCKET": name})
    before = monotonic_usec()
    assert n.reloading()
    after = monotonic_usec()
    got = _fields(sock.recv(4096))
    assert got["RELOADING"] == "1"
    assert before <= int(got["MONOTONIC_USEC"]) <= after
    assert n.watchdog()
    assert _fields(sock.recv(4096)) == {"WATCHDOG": "1"}
    n.close()


def test_no_socket_is_a_silent_no_op() -> None:
    """Outside systemd nothing is sent and nothing fails."""
    n = Notifier({})
    assert not n.enabled
    assert not n.ready()
    assert n.watchdog_interval is None


def test_missing_socket_does_not_raise(tmp_path: Path) -> None:
    """A socket that went away is reported as a failed send, never as an exception."""
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.enabled
    assert not n.status("x")
    assert not n.status("y")
    n.close()


def test_relative_socket_path_disables_notification() -> None:
    """A NOTIFY_SOCKET that is neither absolute nor abstract is refused rather than guessed at."""
    assert not Notifier({"NOTIFY_SOCKET": "relative.sock"}).enabled
    with pytest.raises(ValueError):
        socket_address("relative.sock")


def test_watchdog_interval_honours_watchdog_pid() -> None:
    """WATCHDOG_USEC applies only to the process WATCHDOG_PID names (children inherit the env)."""
    mine = Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())})
    assert mine.watchdog_interval == 30.0
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 30.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "junk"}).watchdog_interval is None


def test_format_message_keeps_one_line_per_key() -> None:
    """A newline inside a value cannot smuggle in another key; a bad key is refused."""
    assert format_message({"STATUS": "a\nREADY=1"}) == b"STATUS=a READY=1"
    with pytest.raises(ValueError):
        format_message({"A=B": 1})
