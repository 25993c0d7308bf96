"""sd_notify(3) without libsystemd: datagrams to ``$NOTIFY_SOCKET`` (a path or an ``@abstract`` name).

Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op, so the daemon calls it unconditionally.
A failed send is logged once and never raised: notification must not take the daemon down.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("mqd.sdnotify")  # its name before mqd/process/: log readers know it


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares RELOADING's MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def socket_address(value: str) -> str | bytes:
    """``NOTIFY_SOCKET`` as ``sendto`` wants it: ``@name`` is Linux's abstract namespace (leading NUL)."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if not value.startswith("/"):
        raise ValueError(f"NOTIFY_SOCKET must be an absolute path or @abstract name, got {value!r}")
    return value


def format_message(fields: Mapping[str, object]) -> bytes:
    """``KEY=value`` lines. Values may not hold newlines: systemd would read the rest as a new key."""
    lines = []
    for key, value in fields.items():
        text = str(value)
        if not key or "=" in key or "\n" in key:
            raise ValueError(f"bad sd_notify key {key!r}")
        lines.append(f"{key}={text.replace(chr(10), ' ')}")
    return "\n".join(lines).encode()


class Notifier:
    """Talks to the service manager. Build one per process; ``close()`` is idempotent."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if raw:
            try:
                self._address = socket_address(raw)
            except ValueError as exc:
                log.warning("sd_notify disabled", reason=str(exc))
        self._sock: socket.socket | None = None
        self._warned = False
        self._watchdog_usec = self._parse_watchdog(env)

    @staticmethod
    def _parse_watchdog(env: Mapping[str, str]) -> int | None:
        try:
            usec = int(env.get("WATCHDOG_USEC", "0"))
        except ValueError:
            return None
        pid = env.get("WATCHDOG_PID")
        # WATCHDOG_PID names the process meant to ping; a child that inherited the env is not it
        if usec <= 0 or (pid and pid != str(os.getpid())):
            return None
        return usec

    @property
    def enabled(self) -> bool:
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds systemd waits for a WATCHDOG=1 before it kills us, or None when no watchdog is set."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 1e6

    def notify(self, **fields: object) -> bool:
        """Send one message; True when it was handed to the socket."""
        if self._address is None:
            return False
        payload = format_message(fields)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify send failed", error=str(exc))
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        fields: dict[str, object] = {"READY": 1}
        if status:
            fields["STATUS"] = status
        fields["MAINPID"] = os.getpid()
        return self.notify(**fields)

    def reloading(self) -> bool:
        return self.notify(RELOADING=1, MONOTONIC_USEC=monotonic_usec())

    def stopping(self, status: str | None = None) -> bool:
        return self.notify(**({"STOPPING": 1, "STATUS": status} if status else {"STOPPING": 1}))

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time to start or stop (EXTEND_TIMEOUT_USEC), e.g. during a long drain."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * 1e6))

    def close(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()
