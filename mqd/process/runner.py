"""The process around the Daemon: what ``mqd run`` (and systemd) runs.

- **pid file**, held with ``flock`` for the life of the process: a second daemon on the same config
  refuses to start, and ``mqd status``/``mqd stop`` tell a live daemon from a stale file by the lock,
  not by a pid that may have been reused.
- **signals**: SIGTERM/SIGINT start a graceful stop (stop fetching, publish what is buffered, commit,
  leave the group) bounded by ``daemon.shutdown_timeout``; a second one forces an exit without the
  drain. Either way nothing acknowledged is lost: offsets are committed only after their file is
  published, so whatever was not published is fetched again by the next owner.
  SIGHUP reloads the config file.
- **sd_notify**: READY after start, RELOADING/READY around a reload, STOPPING, WATCHDOG pings only
  while the daemon's working loop turns, STATUS lines with the throughput every few seconds.
- **admin endpoint** (mqd.operator.admin behind mqd.operator.admin_listener, built by the factory
  ``run`` is given) and ``state_dir/admin.json`` so the CLI finds it.
- **last_exit.json** in ``state_dir``: how the last run ended, for ``mqd stop`` to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from mqd import log as mqdlog
from mqd import metrics
from mqd.config import AdminConfig, ConfigError, MqdConfig, load_daemon_config
from mqd.errors import MqdError
from mqd.fsutil import atomic_write
from mqd.process.sdnotify import Notifier
from mqd.process.state import DaemonSnapshot, RunnerState

if TYPE_CHECKING:  # the CLI imports this module for the pid file helpers: keep aiohttp out of it
    from mqd.consumer import Consumer

log = structlog.get_logger("mqd.runner")  # its name before mqd/process/: log readers know it

STATUS_INTERVAL = 5.0  # seconds between STATUS= lines
STUCK_AFTER = 30.0  # loop silent this long: /healthz fails (and watchdog pings stop, if sooner)
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_TEMPFAIL = 75  # sysexits' EX_TEMPFAIL: the start failed on something a later try may not meet
EXIT_FORCED = 130  # second signal: stopped without the drain
ADMIN_AFTER = 1.0  # seconds of a start still waiting before the admin endpoint starts anyway


class RunnerError(MqdError):
    """The process cannot run (already running, pid file unusable). Not retriable as is."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message, retriable=retriable)


PartitionSpec = tuple[str, int | None]  # ("events", None): every partition of the topic it owns


class AdminEndpoint(Protocol):
    """The admin endpoint as the runner uses it (the CLI's: mqd.operator.admin_listener.AdminListener,
    which binds the port at start and builds mqd.operator.admin.AdminServer at the first
    connection). The caller passes a factory: the endpoint is an operator edge, built by the CLI's
    ``run``, after the first fetch (issue 16); a failure after its start comes to
    ``Runner.admin_failed``."""

    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


AdminFactory = Callable[[AdminConfig, "Runner"], AdminEndpoint]


class DaemonLike(Protocol):
    """The part of mqd.process.daemon.Daemon the runner uses."""

    last_loop_time: float

    @property
    def consumer(self) -> Consumer: ...

    @property
    def stats(self) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def run(self, shutdown: Awaitable[None] | None = None) -> None: ...

    async def stop(self, timeout: float | None = None) -> None: ...

    def snapshot(self) -> DaemonSnapshot: ...

    def health(self) -> tuple[str, list[str]]: ...

    async def reload(self, config: MqdConfig) -> None: ...

    def pause(self, tps: Iterable[Any]) -> None: ...

    def resume(self, tps: Iterable[Any]) -> None: ...


# -- runtime files -------------------------------------------------------------------------------


class PidFile:
    """``flock``-held pid file. ``acquire`` raises RunnerError when another process holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RunnerError(f"cannot open pid file {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                pid = read_pid(self.path)
                raise RunnerError(
                    f"mqd is already running (pid {pid}, pid file {self.path})", retriable=True
                ) from None
            raise RunnerError(f"cannot lock pid file {self.path}: {exc}") from exc
        os.ftruncate(fd, 0)
        # not fsynced: the lock, not the content, tells a live daemon, and after a crash the content
        # names a dead process whatever it says (an fsync here cost 1.5-10 ms before the first fetch)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        # unlink while still holding the lock, so no newcomer's fresh file is removed
        with contextlib.suppress(OSError):
            if read_pid(self.path) == os.getpid():
                self.path.unlink()
        os.close(fd)


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def running_pid(path: Path) -> int | None:
    """The pid of the daemon holding ``path``, or None when no process holds it (stale or absent)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return read_pid(path)  # locked: a daemon holds it
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def admin_file(config: MqdConfig) -> Path:
    return config.daemon.state_dir / "admin.json"


def last_exit_file(config: MqdConfig) -> Path:
    return config.daemon.state_dir / "last_exit.json"


def _write_json(path: Path, data: Mapping[str, Any], *, durable: bool = True) -> None:
    # admin.json and last_exit.json are replaced whole; the pid file is not (PidFile writes it in
    # place: its flock lives on that inode, and a rename would hand the lock file to no one)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = (json.dumps(data, default=str, indent=1) + "\n").encode()
    if durable:
        atomic_write(path, body)
        return
    # a reader still sees the old file or the new one (the rename); what a crash may lose is only
    # the file of a process that is gone (issue 34: the two fsyncs ran on the event loop right after
    # the first fetch, a median 6 ms and up to 0.1 s on a busy disk)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(body)
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- the runner ----------------------------------------------------------------------------------


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(old: MqdConfig, new: MqdConfig) -> list[str]:
    """Dotted keys whose value differs (values are not listed: some are secrets)."""
    a, b = _flatten(old.model_dump()), _flatten(new.model_dump())
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


class Runner:
    """Runs one daemon until it is told to stop. Build in __init__; ``run()`` does everything else."""

    def __init__(
        self,
        config_path: Path,
        config: MqdConfig,
        *,
        burst: bool = False,
        notifier: Notifier | None = None,
        daemon: DaemonLike | None = None,
        admin: AdminFactory | None = None,
    ) -> None:
        self.config_path = config_path
        self.config = config
        self.burst = burst
        self.notifier = notifier or Notifier()
        self._daemon = daemon
        self._pidfile = PidFile(config.daemon.pid_file)
        self._admin_factory = admin  # None: no endpoint, whatever admin.enabled says
        self._admin: AdminEndpoint | None = None
        self._admin_starting: asyncio.Future[None] | None = None
        self._admin_failure: BaseException | None = None  # after its start (admin_failed)
        self._state = RunnerState.STARTING
        self._set_state(RunnerState.STARTING)
        self._started = time.monotonic()
        self._stop_requested: asyncio.Event | None = None
        self._stop_reason = ""
        self._signals = 0
        self._reload_task: asyncio.Task[None] | None = None
        self._reload_again = False
        self._reload: dict[str, Any] = {"count": 0, "ok": None, "error": None, "at": None}
        self._tasks: list[asyncio.Task[None]] = []
        self._drain_seconds: float | None = None
        self._stop_at: float | None = None  # when the stop was asked for (the drain starts there)

    def _set_state(self, state: RunnerState) -> None:
        self._state = state
        for name in RunnerState:
            metrics.daemon_state.labels(name).set(1 if name == state else 0)

    @property
    def daemon(self) -> DaemonLike:
        if self._daemon is None:
            raise RuntimeError("the daemon is not built yet")
        return self._daemon

    # -- AdminTarget -----------------------------------------------------------------------------

    def _loop_age(self) -> float | None:
        if self._daemon is None or self._daemon.last_loop_time <= 0:
            return None
        last = self._daemon.last_loop_time
        return time.monotonic() - last

    def _stuck_after(self) -> float:
        wd = self.notifier.watchdog_interval
        return min(STUCK_AFTER, wd / 2) if wd else STUCK_AFTER

    def liveness(self) -> tuple[bool, str]:
        if self._state != RunnerState.RUNNING:
            return True, self._state
        age = self._loop_age()
        if age is not None and age > self._stuck_after():
            return False, f"working loop silent for {age:.0f}s"
        return True, "working loop turning"

    def health(self) -> tuple[str, list[str]]:
        return self._health(None)

    def _health(self, snap: DaemonSnapshot | None) -> tuple[str, list[str]]:
        """The process's health: the daemon's (from ``snap`` when the caller took one) while the
        runner is running or reloading, then the runner's own reasons."""
        reasons: list[str] = []
        status = "ok"
        if self._daemon is not None and self._state in (RunnerState.RUNNING, RunnerState.RELOADING):
            if snap is not None:
                status, reasons = snap.health, list(snap.reasons)
            else:
                status, reasons = self._daemon.health()
                reasons = list(reasons)
        elif self._state != RunnerState.RUNNING:
            status, reasons = "degraded", [f"daemon is {self._state}"]
        live, why = self.liveness()
        if not live:
            status = "degraded"
            reasons.append(why)
        if self._reload["ok"] is False:
            status = "degraded"
            reasons.append(f"config file {self.config_path} is invalid; running the previous config")
        return status, reasons

    def readiness(self) -> tuple[bool, list[str]]:
        status, reasons = self.health()
        return self._state == RunnerState.RUNNING and status == "ok", reasons

    def status(self) -> dict[str, Any]:
        """The status JSON the admin endpoint serves: the state and health of the process, the
        daemon's sections (from one ``DaemonSnapshot``), then the runner's own section."""
        out: dict[str, Any] = {}
        snap: DaemonSnapshot | None = None
        if self._daemon is not None:
            try:
                snap = self._daemon.snapshot()
            except Exception as exc:  # the status page must not die with the daemon
                out["status_error"] = f"{type(exc).__name__}: {exc}"
                out["stats"] = self._daemon_stats()
        # the daemon's state while the runner runs; the runner's while it starts, reloads or stops
        out["state"] = snap.state if snap is not None and self._state == RunnerState.RUNNING else self._state
        health, reasons = self._health(snap)
        out["health"] = {"status": health, "reasons": reasons}
        if snap is not None:
            out.update(snap.sections_json())
        out["runner"] = {
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._started, 1),
            "config_file": str(self.config_path),
            "burst": self.burst,
            "reload": dict(self._reload),
            "admin_url": self._admin.url if self._admin is not None else None,
            "loop_age_s": None if (age := self._loop_age()) is None else round(age, 3),
            "systemd": self.notifier.enabled,
        }
        return out

    def _resolve(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        # the consumer's own assignment, not the status JSON read back
        owned: list[tuple[str, int]] = []
        if self._daemon is not None:
            owned = [(tp.topic, tp.partition) for tp in sorted(self._daemon.consumer.assignment())]
        out: list[tuple[str, int]] = []
        for topic, part in specs:
            if part is not None:
                out.append((topic, part))
                continue
            mine = [tp for tp in owned if tp[0] == topic]
            if not mine:
                # the endpoint answers 404 not_assigned, as for a partition the daemon does not own
                raise KeyError(f"topic {topic!r} has no partition assigned to this daemon")
            out.extend(mine)
        return sorted(set(out))

    def _tps(self, pairs: Iterable[tuple[str, int]]) -> list[Any]:
        from mqd.topic_partition import TopicPartition

        return [TopicPartition(t, p) for t, p in pairs]

    def pause(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        pairs = self._resolve(specs)
        self.daemon.pause(self._tps(pairs))
        return pairs

    def resume(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        pairs = self._resolve(specs)
        self.daemon.resume(self._tps(pairs))
        return pairs

    # -- signals ---------------------------------------------------------------------------------

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, "SIGTERM")
        loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, "SIGINT")
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)

    def _remove_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)

    def loading_code(self) -> contextlib.AbstractContextManager[None]:
        """Around the admin endpoint's build (its first connection, on a worker thread): the
        daemon's memory gauge counts what it loads as code, not as records' memory."""
        return self.daemon.consumer.loading_code()

    def admin_failed(self, exc: BaseException) -> None:
        """The admin endpoint failed once records flowed (its bind after the daemon's start, or its
        build at the first connection, mqd/operator/admin_listener.py): the process stops and exits
        1 with the reason, as when the endpoint fails during the start."""
        self._admin_failure = exc
        self.request_stop("admin endpoint failure")

    def request_stop(self, reason: str) -> None:
        if self._stop_requested is not None and not self._stop_requested.is_set():
            self._stop_reason = reason
            self._stop_at = time.monotonic()
            self._stop_requested.set()

    def _on_stop_signal(self, name: str) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info(
                "stopping: draining buffered records, then committing",
                signal=name,
                timeout_s=self.config.daemon.shutdown_timeout,
            )
            self.notifier.stopping(f"stopping on {name}: draining")
            self.request_stop(name)
            return
        self._force_exit(name)

    def _force_exit(self, name: str) -> None:
        # Nothing acknowledged is lost: offsets are committed only after their file is published,
        # so what was buffered and not published is fetched again by the next owner.
        log.warning("second stop signal: exiting now without draining", signal=name)
        self._write_last_exit(EXIT_FORCED, clean=False, reason=f"forced by a second {name}")
        with contextlib.suppress(Exception):
            self._remove_admin_file()
        self._pidfile.release()
        logging.shutdown()
        os._exit(EXIT_FORCED)

    def _on_reload_signal(self) -> None:
        if self._state not in (RunnerState.RUNNING, RunnerState.RELOADING):
            log.info("SIGHUP ignored: daemon is not running", state=self._state)
            return
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_again = True  # the file may have changed after the running reload read it
            return
        self._reload_task = asyncio.get_running_loop().create_task(self._reload_loop())

    async def _reload_loop(self) -> None:
        while True:
            self._reload_again = False
            await self.reload()
            if not self._reload_again or self._state not in (RunnerState.RUNNING, RunnerState.RELOADING):
                return

    async def reload(self) -> bool:
        """Re-read the config file and apply it; an invalid file is refused and the old config stays."""
        self._set_state(RunnerState.RELOADING)
        self.notifier.reloading()
        ok, error = False, None
        try:
            new = load_daemon_config(self.config_path)
            self._check_reloadable(new)
            await self.daemon.reload(new)
        except ConfigError as exc:
            error = str(exc)
            log.error(
                "reload refused: keeping the running config", config_file=str(self.config_path), error=error
            )
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.exception("reload failed: keeping the running config", config_file=str(self.config_path))
        else:
            ok = True
            changed = config_changes(self.config, new)
            if new.log.level != self.config.log.level:
                mqdlog.set_level(new.log.level)
            self.config = new
            # warning, so the line survives the level it may just have set
            log.warning("config reloaded", config_file=str(self.config_path), changed=changed)
        self._reload.update(count=int(self._reload["count"] or 0) + 1, ok=ok, error=error, at=time.time())
        metrics.reloads.labels("ok" if ok else "refused").inc()
        if self._state == RunnerState.RELOADING:
            self._set_state(RunnerState.RUNNING)
            # READY=1 ends the reload for systemd (notify-reload waits for it)
            self.notifier.ready(self._status_line() if ok else f"reload refused: {error}".splitlines()[0])
        return ok

    def _check_reloadable(self, new: MqdConfig) -> None:
        """Keys the running process cannot change: refuse the whole reload rather than apply half."""
        fixed = {
            "daemon.pid_file": (self.config.daemon.pid_file, new.daemon.pid_file),
            "daemon.state_dir": (self.config.daemon.state_dir, new.daemon.state_dir),
            "admin": (self.config.admin, new.admin),
            "log.format": (self.config.log.format, new.log.format),
        }
        changed = [k for k, (old, cur) in fixed.items() if old != cur]
        if changed:
            raise ConfigError(
                f"{self.config_path}: {', '.join(changed)} cannot change on reload; restart mqd to apply"
            )

    # -- background tasks ------------------------------------------------------------------------

    async def _watchdog(self, interval: float) -> None:
        """Ping at half the watchdog interval, but only while the working loop is turning."""
        while True:
            await asyncio.sleep(interval / 2)
            age = self._loop_age()
            if age is None or age <= interval / 2:
                self.notifier.watchdog()
            else:
                log.error("working loop stuck: withholding watchdog ping", loop_age_s=round(age, 1))

    def _daemon_stats(self) -> dict[str, Any]:
        """The daemon's counters, empty before it is built."""
        return {} if self._daemon is None else dict(self._daemon.stats)

    def _status_line(self) -> str:
        stats = self._daemon_stats()
        recs, files = stats.get("records_published", 0), stats.get("files_published", 0)
        return f"{self._rate_text} published {recs} records in {files} files".strip()

    _rate_text = ""

    async def _status_lines(self) -> None:
        prev: tuple[float, int, int] | None = None
        while True:
            stats = self._daemon_stats()
            now = time.monotonic()
            recs, nbytes = stats.get("records_published", 0), stats.get("bytes_published", 0)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                self._rate_text = (
                    f"{(recs - prev[1]) / dt:.0f} records/s, {(nbytes - prev[2]) / dt / 1e6:.1f} MB/s;"
                )
            prev = (now, recs, nbytes)
            self.notifier.status(self._status_line())
            await asyncio.sleep(STATUS_INTERVAL)

    # -- admin file and exit record --------------------------------------------------------------

    def _write_admin_file(self) -> None:
        if self._admin is None:
            return
        _write_json(
            admin_file(self.config),
            {"pid": os.getpid(), "url": self._admin.url, "config_file": str(self.config_path)},
            durable=False,  # it describes this live process only: `mqd status` checks the pid
        )

    def _remove_admin_file(self) -> None:
        path = admin_file(self.config)
        data = read_json(path)
        if data is not None and data.get("pid") == os.getpid():
            path.unlink(missing_ok=True)

    def _write_last_exit(self, code: int, *, clean: bool, reason: str) -> None:
        with contextlib.suppress(OSError):
            _write_json(
                last_exit_file(self.config),
                {
                    "pid": os.getpid(),
                    "exit_code": code,
                    "clean": clean,
                    "reason": reason,
                    "drain_seconds": self._drain_seconds,
                    "stopped_at": time.time(),
                    "stats": self._daemon_stats(),
                },
            )

    # -- main ------------------------------------------------------------------------------------

    def _build_daemon(self) -> DaemonLike:
        from mqd.process.daemon import Daemon

        daemon: DaemonLike = Daemon(self.config, burst=self.burst)
        return daemon

    async def run(self) -> int:
        """Run until stopped; returns the process exit code."""
        loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        try:
            self._pidfile.acquire()
        except RunnerError as exc:
            log.error("cannot start", error=str(exc))
            return EXIT_FAILURE
        code = EXIT_OK
        reason = "stopped"
        self._install_signals(loop)
        try:
            if self._daemon is None:
                self._daemon = self._build_daemon()
            starting = asyncio.ensure_future(self.daemon.start())
            if self.config.admin.enabled and self._admin_factory is not None:
                self._admin_starting = asyncio.ensure_future(self._start_admin(starting))
            if not await self._until_stop(self._daemon_started(starting)):
                reason = f"stopped on {self._stop_reason} while starting"
            else:
                self._set_state(RunnerState.RUNNING)
                self._start_background()
                # records flow while the admin endpoint is still being imported and bound (issue 34):
                # READY=1 and "mqd running" wait for it
                self._tasks.append(loop.create_task(self._announce_running()))
                await self.daemon.run(self._wait_stop())
                reason = f"stopped on {self._stop_reason}" if self._stop_reason else "burst finished"
        except RunnerError as exc:
            log.error("cannot start", error=str(exc))
            code, reason = EXIT_FAILURE, str(exc)
        except MqdError as exc:
            if not (exc.retriable and self._state == RunnerState.STARTING):
                log.exception("daemon failed")
                code, reason = EXIT_FAILURE, f"daemon failed: {type(exc).__name__}: {exc}"
            else:
                # the source unreachable for request_timeout (or the like): the service manager
                # starts us again later, as for the Spark job without a session
                log.error(
                    "cannot start now, a later start may succeed", error=str(exc), exit_code=EXIT_TEMPFAIL
                )
                code, reason = EXIT_TEMPFAIL, f"cannot start now: {exc}"
        except Exception as exc:
            log.exception("daemon failed")
            code, reason = EXIT_FAILURE, f"daemon failed: {type(exc).__name__}: {exc}"
        finally:
            failure = self._admin_failure
            if failure is not None and code == EXIT_OK:  # logged where it happened
                named = isinstance(failure, MqdError)  # mqd's own errors say what failed
                detail = str(failure) if named else f"{type(failure).__name__}: {failure}"
                code, reason = EXIT_FAILURE, f"admin endpoint failed: {detail}"
            code = await self._shutdown(code, reason)
            self._remove_signals(loop)
        return code

    async def _start_admin(self, starting: asyncio.Future[None]) -> None:
        """Start the admin endpoint once the daemon is up (its first fetch is out by then: the
        endpoint's imports and bind come after it, issue 16), or after ADMIN_AFTER seconds of a
        start that waits (cluster unreachable), so that `mqd status` can say why. Either way it is
        up before READY=1."""
        assert self._stop_requested is not None
        stop = asyncio.ensure_future(self._stop_requested.wait())
        waiters: set[asyncio.Future[Any]] = {starting, stop}
        try:
            await asyncio.wait(waiters, timeout=ADMIN_AFTER, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if starting.done() and (starting.cancelled() or starting.exception() is not None):
            return  # the start failed: run() reports it
        assert self._admin_factory is not None
        # built on a worker thread: a factory may import (the CLI's imports the endpoint's listener,
        # which imports aiohttp only at the first connection)
        self._admin = await asyncio.to_thread(self._admin_factory, self.config.admin, self)
        try:
            await self._admin.start()
        except MqdError as exc:
            # the port is taken (or the like): the start in progress is abandoned
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            raise RunnerError(str(exc)) from exc
        self._write_admin_file()

    async def _daemon_started(self, starting: asyncio.Future[None]) -> None:
        """The daemon's start (cancelled if this is). An admin endpoint that fails to start before
        the daemon did fails the start."""
        admin = self._admin_starting
        try:
            if admin is not None:
                await asyncio.wait({starting, admin}, return_when=asyncio.FIRST_COMPLETED)
                if admin.done():
                    admin.result()  # RunnerError: the port is taken (the start was cancelled)
            await starting
        finally:
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await starting

    async def _announce_running(self) -> None:
        """READY=1 and "mqd running" once the admin endpoint (when there is one) is up. An endpoint
        that cannot start stops the process, which exits 1 as when that happens during the start."""
        if self._admin_starting is not None:
            try:
                # shielded: a stop must not cancel the endpoint halfway through its bind
                await asyncio.shield(self._admin_starting)
            except Exception as exc:
                log.error("admin endpoint failed", error=str(exc))
                self.admin_failed(exc)
                return
        self.notifier.ready(f"consuming {', '.join(self.config.consumer.topics)}")
        log.info("mqd running", pid=os.getpid(), config_file=str(self.config_path), burst=self.burst)

    async def _wait_stop(self) -> None:
        assert self._stop_requested is not None
        await self._stop_requested.wait()

    async def _until_stop(self, aw: Awaitable[None]) -> bool:
        """Await ``aw`` unless a stop is requested first (then cancel it); True when it completed."""
        assert self._stop_requested is not None
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._wait_stop())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False

    def _start_background(self) -> None:
        loop = asyncio.get_running_loop()
        wd = self.notifier.watchdog_interval
        if wd and self.config.daemon.watchdog:
            self._tasks.append(loop.create_task(self._watchdog(wd)))
        if self.notifier.enabled:
            self._tasks.append(loop.create_task(self._status_lines()))

    async def _shutdown(self, code: int, reason: str) -> int:
        self._set_state(RunnerState.STOPPING)
        timeout = self.config.daemon.shutdown_timeout
        self.notifier.stopping("stopping: draining")
        # a shutdown_timeout raised above the unit's TimeoutStopSec still gets its drain
        self.notifier.extend_timeout(timeout + 5)
        t0 = self._stop_at or time.monotonic()
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_task.cancel()
        if self._daemon is not None:
            try:
                # the daemon bounds its own drain; the margin only catches a drain that ignores it
                await asyncio.wait_for(self._daemon.stop(timeout=timeout), timeout + 5)
            except TimeoutError:
                log.error("drain did not finish in time; exiting without it", timeout_s=timeout)
                code, reason = EXIT_FAILURE, f"drain exceeded shutdown_timeout ({timeout}s)"
            except Exception as exc:
                log.exception("stop failed")
                code, reason = EXIT_FAILURE, f"stop failed: {type(exc).__name__}: {exc}"
        self._drain_seconds = round(time.monotonic() - t0, 3)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._admin_starting is not None:
            # bounded (imports, bind); its failure was reported where it happened
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._admin_starting
        if self._admin is not None:
            await self._admin.stop()
            self._remove_admin_file()
        self._set_state(RunnerState.STOPPED)
        self._write_last_exit(code, clean=code == EXIT_OK, reason=reason)
        log.info("mqd stopped", exit_code=code, reason=reason, drain_seconds=self._drain_seconds)
        self._pidfile.release()
        self.notifier.close()
        return code


def run(
    config_path: Path, config: MqdConfig, *, burst: bool = False, admin: AdminFactory | None = None
) -> int:
    """Entry point of ``mqd run``: logging, uvloop, the runner (with the admin endpoint ``admin``
    builds). Returns the exit code."""
    mqdlog.configure(config.log.level, config.log.format)
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep running without it
        factory = None
    runner = Runner(config_path, config, burst=burst, admin=admin)
    with asyncio.Runner(loop_factory=factory) as aio:
        return aio.run(runner.run())
