"""The one child-process manager of the testing API, the chaos harness and the benchmarks.

A :class:`ManagedProcess` is one command with its log file: start it (stdout and stderr appended to
the log after a banner line), wait until it is ready, signal it, stop it (the signal, then SIGKILL
after a deadline), and start it again. Synchronous and asynchronous callers share the same logic:
``stop``/``wait_ready`` sleep with ``time.sleep``, ``stop_async``/``wait_ready_async`` with
``asyncio.sleep``, so a caller whose event loop also runs proxies never blocks it.

The process is reaped with ``wait4`` (never with ``Popen.wait``), so its CPU seconds from the kernel
(``rusage``) are there for whoever measures it: the benchmarks report them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from mqd.errors import MqdError
from mqd.waiting import wait_until, wait_until_sync

# a broker's start is ~1 s of CPU (interpreter, imports); beside the many-hosts rig's Spark cluster
# a 2-core machine ran at load 24 and four brokers had logged nothing after 20 s (CI, 2026-12-03)
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
_POLL = 0.02
_PR_SET_PDEATHSIG = 1


class ProcessError(MqdError, RuntimeError):
    """A child process did not do what its manager needed: it exited while starting, or it is (not)
    running when it should (not) be. Not retriable as is. A RuntimeError too, as before mqd.testing."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class ManagedProcess:
    """One child process and its log file; it can be started again after it exited.

    ``die_with_parent``: the kernel SIGKILLs the child when this process dies (``PR_SET_PDEATHSIG``),
    so a harness killed half-way leaves nothing behind. ``env`` replaces the environment (None: ours).
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.die_with_parent = die_with_parent
        self.returncode: int | None = None
        self.rusage: resource.struct_rusage | None = None
        self.frozen = False  # SIGSTOPped by send_signal and not continued since
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop_asked = False  # the exit under way or done was asked for (stop, kill_now)
        self._exit_reported = False

    # -- state -------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Started and not exited (a frozen process is running)."""
        return self._proc is not None and self.poll() is None

    def poll(self) -> int | None:
        """The exit code once the process exited (reaping it), None while it runs or before start."""
        proc = self._proc
        if proc is None or self.returncode is not None:
            return self.returncode
        try:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: the code is lost, say so
            self.returncode = proc.returncode if proc.returncode is not None else -1
            proc.returncode = self.returncode
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self.rusage = usage
        proc.returncode = self.returncode  # keep Popen consistent: it must not wait for it again
        self.frozen = False
        return self.returncode

    def unasked_exit(self) -> int | None:
        """The exit code if the process exited without ``stop``/``kill_now`` asking it to; reported
        once per start (a supervisor counts it as a crash)."""
        if self._stop_asked or self._exit_reported or self.poll() is None:
            return None
        self._exit_reported = True
        return self.returncode

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log file ('' when there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- start -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the command; stdout and stderr go to the log file after a banner line."""
        if self.running:
            raise ProcessError(f"{self.name} is already running")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"===== start {self.name} at {time.time():.3f} =====\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self.returncode = None
        self.rusage = None
        self.frozen = False
        self._stop_asked = False
        self._exit_reported = False

    def _ready_or_raise(self, ready: object) -> bool:
        if ready:
            return True
        if self.poll() is not None:
            raise ProcessError(f"{self.name} exited with {self.returncode} while starting:\n{self.tail()}")
        return False

    def wait_ready(
        self, ready: Callable[[], object], timeout: float = START_TIMEOUT, *, interval: float = 0.05
    ) -> None:
        """Poll ``ready`` until it is truthy. ProcessError if the process exits first, TimeoutError
        after ``timeout``; both carry the end of the log."""
        try:
            wait_until_sync(
                lambda: self._ready_or_raise(ready()), timeout, f"{self.name} to be ready", interval=interval
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.tail()}") from None

    async def wait_ready_async(
        self,
        ready: Callable[[], Awaitable[object]],
        timeout: float = START_TIMEOUT,
        *,
        interval: float = 0.05,
    ) -> None:
        """``wait_ready`` with an async ``ready`` and without blocking the event loop."""

        async def check() -> bool:
            return self._ready_or_raise(await ready())

        try:
            await wait_until(check, timeout, f"{self.name} to be ready", interval=interval)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}:\n{self.tail()}") from None

    # -- signals and stop --------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` without waiting (SIGSTOP/SIGCONT freeze and thaw it)."""
        if not self.running or self._proc is None:
            raise ProcessError(f"{self.name} is not running")
        os.kill(self._proc.pid, sig)  # not Popen.send_signal: it would reap and lose the rusage
        if sig == signal.SIGSTOP:
            self.frozen = True
        elif sig == signal.SIGCONT:
            self.frozen = False

    def _exited(self) -> bool:
        return self.poll() is not None

    def begin_stop(self, sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` (and SIGCONT, so a frozen process can act on it) and mark the exit as asked
        for. False when there is nothing to stop (never started, or already exited)."""
        if self._proc is None:
            return False
        self._stop_asked = True
        if self.poll() is not None:
            return False
        os.kill(self._proc.pid, sig)
        if sig != signal.SIGKILL:
            os.kill(self._proc.pid, signal.SIGCONT)
        return True

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the exit and return its code; TimeoutError after."""
        wait_until_sync(self._exited, timeout, f"{self.name} to exit", interval=_POLL)
        assert self.returncode is not None
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig``, wait up to ``timeout`` for the exit, SIGKILL after; the exit code (None
        when it was never started)."""
        self.begin_stop(sig)
        if self._proc is None:
            return None
        try:
            return self.wait(timeout)
        except TimeoutError:
            self.begin_stop(signal.SIGKILL)
            return self.wait(timeout)

    async def stop_async(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int | None:
        """``stop`` without blocking the event loop."""
        self.begin_stop(sig)
        if self._proc is None:
            return None
        try:
            await wait_until(self._exited, timeout, f"{self.name} to exit", interval=_POLL)
        except TimeoutError:
            self.begin_stop(signal.SIGKILL)
            await wait_until(self._exited, timeout, f"{self.name} to exit after SIGKILL", interval=_POLL)
        return self.returncode

    def kill_now(self) -> None:
        """SIGKILL and reap (bounded): the last-resort cleanup of finally blocks."""
        if self.begin_stop(signal.SIGKILL):
            try:
                self.wait(5.0)
            except TimeoutError:
                pass
