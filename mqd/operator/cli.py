"""The ``mqd`` command. Each subcommand imports its module lazily so ``mqd --help`` stays fast.

Exit codes: 0 ok / healthy, 1 failure / degraded, 2 bad config or usage, 3 not running.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click

from mqd.config import ConfigError

if TYPE_CHECKING:
    from mqd.config import AdminConfig
    from mqd.operator.admin import AdminServer
    from mqd.operator.admin_listener import AdminListener
    from mqd.process.runner import Runner

# Arrow fixes its allocator when pyarrow is first imported, so this must happen before any command
# imports it. jemalloc: the Kafka source's decoded records and the landing's encoder live there,
# away from glibc's heap, whose holes between them were most of the daemon's peak RSS above idle
# (docs/decisions/043-fetch-answers-in-place-jemalloc.md). An operator's choice wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
# One jemalloc arena for every thread: the event loop allocates fetch answers and decoded records,
# the landing threads free them and allocate the encoder's buffers. With an arena per thread
# (jemalloc's default, 4 per CPU) each kept its own freed pages apart from the others' needs;
# shared, the Kafka source's peak RSS above idle fell by ~20 MiB (same docs section). Arrow's
# jemalloc reads this variable when it first allocates; an operator's options win.
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "narenas:1")
# pydantic looks for plugins (every installed distribution's entry points) when the first model
# builds its validator: 5-13 ms of CPU before the first fetch, for plugins no mqd command uses
# (issue 34). An operator's setting wins, an empty one included.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
# numpy's OpenBLAS starts a thread per core when numpy loads, and they spin before they sleep: ~0.1
# CPU-s of a run's start on 2 cores (a 1,000-record burst: 0.50 -> 0.39 CPU-s), for BLAS routines mqd
# never calls (its arrays are offsets, lengths and masks; issue 34). An operator's count wins, set in
# any variable OpenBLAS reads.
if not any(name in os.environ for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")):
    os.environ["OPENBLAS_NUM_THREADS"] = "1"

EXIT_OK = 0
EXIT_FAIL = 1  # also "degraded" for status
EXIT_CONFIG = 2
EXIT_NOT_RUNNING = 3
EXIT_STUCK = 4  # status: a partition is stuck (nothing landed for stuck_intervals polls, log end grew)

DEFAULT_CONFIG = "/etc/mqd/mqd.toml"
_SERVICE_ENV = frozenset(
    ("NOTIFY_SOCKET", "JOURNAL_STREAM", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")
)


def _die(message: str, code: int) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(code)


def _config_option(f: Any) -> Any:
    return click.option(
        "--config",
        "-c",
        "config_path",
        type=click.Path(path_type=Path),
        default=DEFAULT_CONFIG,
        envvar="MQD_CONFIG",
        show_default=True,
        show_envvar=True,
        help="The daemon's TOML file.",
    )(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="mqd")
def main() -> None:
    """mqd: pull a partitioned message queue and land it exactly once as Parquet for Spark.

    \b
    Daemon:      run, start, stop, status, top, reload, pause, resume
    Config:      config check
    Landing:     landing migrate, landing clean, landing check, landing query
    Offsets:     offsets show, offsets reset
    Cluster:     broker, broker-credentials, broker-init, produce
    Spark:       spark, table describe, table optimize, table vacuum, table convert
    \b
    Exit codes: 0 ok/healthy, 1 failed/degraded, 2 bad config or usage, 3 not running.
    Every command takes --help, with examples.
    """
    # As a library mqd logs nothing unless the application sets logging up (mqd/log.py); this command
    # is that application: warnings reach stderr (run, broker and spark configure their own level)
    if not logging.getLogger().handlers:
        from mqd import log as mqdlog

        mqdlog.configure("warning")


# -- helpers ------------------------------------------------------------------------------------


def _load(config_path: Path) -> Any:
    """The daemon config, or exit 2 with the file, key path and what is allowed."""
    from mqd.config import load_daemon_config

    try:
        return load_daemon_config(config_path)
    except ConfigError as exc:
        _die(f"error: {exc}", EXIT_CONFIG)


@dataclass(frozen=True, slots=True)
class _Runtime:
    """Where a running daemon is found; read from the config even when the file has become invalid,
    so ``mqd stop``/``status`` still reach a daemon whose file someone broke."""

    pid_file: Path
    state_dir: Path
    admin_url: str | None
    admin_token: str | None
    shutdown_timeout: float


def _runtime(config_path: Path) -> _Runtime:
    from mqd.config import DaemonSection, load_daemon_config, read_toml
    from mqd.operator import admin_listener

    try:
        cfg = load_daemon_config(config_path)
        daemon, admin = cfg.daemon, cfg.admin
        port: int = admin.port
        host: str = admin.host
        token = admin.auth_token
        enabled = admin.enabled
    except ConfigError as exc:
        try:
            data = read_toml(config_path)
        except ConfigError:
            _die(f"error: {exc}", EXIT_CONFIG)
        click.echo(f"warning: {exc}\nwarning: using the file's daemon and admin keys as they are", err=True)
        base = config_path.resolve().parent
        raw_d: dict[str, Any] = data["daemon"] if isinstance(data.get("daemon"), dict) else {}
        raw_a: dict[str, Any] = data["admin"] if isinstance(data.get("admin"), dict) else {}
        known = {k: v for k, v in raw_d.items() if k in DaemonSection.model_fields}
        try:
            daemon = DaemonSection.model_validate(known)
        except ValueError:
            daemon = DaemonSection()
        daemon = daemon.model_copy(
            update={
                k: (p if p.is_absolute() else base / p)
                for k in ("state_dir", "pid_file")
                for p in [Path(getattr(daemon, k))]
            }
        )
        port = raw_a.get("port", 9480) if isinstance(raw_a.get("port", 9480), int) else 9480
        host = str(raw_a.get("host", "127.0.0.1"))
        token = raw_a.get("auth_token") if isinstance(raw_a.get("auth_token"), str) else None
        enabled = raw_a.get("enabled", True) is not False
    url = None
    if enabled and port:
        host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        url = admin_listener.http_url(host, port)
    return _Runtime(daemon.pid_file, daemon.state_dir, url, token, daemon.shutdown_timeout)


def _admin_url(rt: _Runtime, pid: int) -> str | None:
    """The running daemon's admin URL: its admin.json (right even for port 0), else the config's."""
    from mqd.process.runner import read_json

    data = read_json(rt.state_dir / "admin.json")
    if data and data.get("pid") == pid and isinstance(data.get("url"), str):
        return str(data["url"])
    return rt.admin_url


def _http(method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 5.0) -> Any:
    """JSON over HTTP to the admin endpoint; raises click.ClickException with the server's reason."""
    import urllib.error  # http.client and email: not on `mqd run`'s path
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read())
            reason = err.get("reason") or err.get("error") or str(exc)
        except ValueError:
            reason = str(exc)
        raise click.ClickException(f"{method} {url}: {exc.code}: {reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"{method} {url}: {getattr(exc, 'reason', exc)}") from None


def _running(rt: _Runtime) -> int | None:
    from mqd.process.runner import running_pid

    return running_pid(rt.pid_file)


def _not_running(rt: _Runtime, as_json: bool = False) -> NoReturn:
    from mqd.process.runner import read_json

    last = read_json(rt.state_dir / "last_exit.json")
    if as_json:
        click.echo(json.dumps({"state": "not running", "pid_file": str(rt.pid_file), "last_exit": last}))
    else:
        msg = f"mqd is not running (pid file {rt.pid_file})"
        if last:
            msg += f"\n  last exit: code {last.get('exit_code')}, {last.get('reason')}"
        click.echo(msg)
    sys.exit(EXIT_NOT_RUNNING)


# -- daemon commands --------------------------------------------------------------------------------


@main.command()
@_config_option
@click.option("--burst", is_flag=True, help="Exit once every assigned partition is caught up and landed.")
def run(config_path: Path, burst: bool) -> None:
    """Run the daemon in the foreground (what systemd starts).

    Logs go to stderr: readable on a terminal, JSON lines otherwise. SIGTERM or Ctrl-C drains and
    exits 0; a second one exits at once (nothing acknowledged is lost either way). SIGHUP reloads.

    \b
    Examples:
      mqd run --config config/mqd.toml
      mqd run -c config/mqd.toml --burst       # land the backlog, then exit
      MQD_LOG__LEVEL=debug mqd run -c /etc/mqd/mqd.toml
    """
    import gc

    # Start-up creates some 60k objects that live as long as the process (modules, classes, config
    # models) and next to no garbage: the collector's passes over them cost ~30 ms of CPU before the
    # first fetch (issue 16). It runs again once they are in place, before the event loop starts,
    # and never walks them again (gc.freeze): each full collection skips them (issue 34).
    collecting = gc.isenabled()
    gc.disable()
    try:
        from mqd.process import daemon  # noqa: F401  # what the runner builds, imported here with the rest
        from mqd.process.runner import run as run_daemon

        cfg = _load(config_path)
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    _exit_after_run(run_daemon(config_path, cfg, burst=burst, admin=_admin_endpoint))


def _exit_after_run(code: int) -> NoReturn:
    """End ``mqd run`` without the interpreter's teardown (issue 34). When the runner returns, the
    daemon is stopped (published, committed, the group left), last_exit.json is written, the pid
    file released and the event loop closed with its executor. What a normal exit does after that is
    the atexit handlers (logging.shutdown flushes the log, weakref finalizers, pyarrow's and
    deltalake's own), which run here too, and freeing every module and object one by one, Arrow's
    and jemalloc's globals with them: ~30-50 ms of CPU that the kernel's reclaim of the whole address
    space makes pointless. A Python thread that is not a daemon thread would be joined by a normal
    exit: with one still running, the exit is the normal one."""
    import atexit
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: a normal exit would not report it either
            pass
    os._exit(code)


def _admin_endpoint(config: AdminConfig, runner: Runner) -> AdminListener:
    """The daemon's admin endpoint: its port bound at the start, aiohttp imported and the endpoint
    built at the first connection (mqd/operator/admin_listener.py)."""
    from mqd.operator.admin_listener import AdminListener

    def build() -> AdminServer:
        with runner.loading_code():  # ~10 MiB of code: not what the byte budget bounds
            from mqd.operator.admin import AdminServer

            return AdminServer(config, runner)

    return AdminListener(config, build, runner.admin_failed)


@main.command()
@_config_option
@click.option(
    "--wait",
    "wait_s",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds to wait until the daemon is up.",
)
def start(config_path: Path, wait_s: float) -> None:
    """Start the daemon in the background (pid file, log file) and wait until it is up.

    \b
    Examples:
      mqd start --config config/mqd.toml
      mqd start -c config/mqd.toml && mqd status -c config/mqd.toml
    """
    from mqd.process.runner import read_json

    cfg = _load(config_path)
    rt = _runtime(config_path)
    pid = _running(rt)
    if pid is not None:
        click.echo(f"mqd is already running (pid {pid})")
        sys.exit(EXIT_OK)
    log_file: Path = cfg.daemon.log_file
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        logf = open(log_file, "ab")  # handed to the child
    except OSError as exc:
        _die(f"error: cannot open log file {log_file}: {exc}", EXIT_FAIL)
    # a detached daemon must not talk to the caller's service manager
    env = {k: v for k, v in os.environ.items() if k not in _SERVICE_ENV}
    cmd = [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(config_path.resolve())]
    with logf:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            tail = _tail(log_file, 15)
            _die(f"mqd failed to start (exit code {code}); last lines of {log_file}:\n{tail}", EXIT_FAIL)
        info = read_json(rt.state_dir / "admin.json")
        if not cfg.admin.enabled:
            if _running(rt) == proc.pid:
                break
        elif info and info.get("pid") == proc.pid:
            try:
                state = _http("GET", f"{info['url']}/status", token=rt.admin_token, timeout=2).get("state")
            except click.ClickException:
                state = None
            if state not in (None, "starting"):
                break
        time.sleep(0.1)
    else:
        _die(
            f"mqd (pid {proc.pid}) is not up after {wait_s:.0f}s; it keeps trying, see {log_file}", EXIT_FAIL
        )
    click.echo(f"mqd started (pid {proc.pid}), logging to {log_file}")


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return b"\n".join(fh.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError as exc:
        return f"(cannot read: {exc})"


@main.command()
@_config_option
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=None,
    help="Seconds to wait for the drain [default: daemon.shutdown_timeout + 10].",
)
@click.option("--force", is_flag=True, help="SIGKILL the daemon if it has not stopped by the timeout.")
def stop(config_path: Path, timeout_s: float | None, force: bool) -> None:
    """Stop the daemon: SIGTERM, wait for the drain, report how it ended.

    The daemon stops fetching, publishes what is buffered, commits and leaves its group. Running
    stop again during the drain is a second SIGTERM: the daemon exits at once (code 130); records
    not yet published are fetched again later, nothing acknowledged is lost.

    \b
    Examples:
      mqd stop --config config/mqd.toml
      mqd stop -c config/mqd.toml --timeout 60 --force
    """
    from mqd.process.runner import read_json

    rt = _runtime(config_path)
    pid = _running(rt)
    if pid is None:
        click.echo("mqd is not running")
        sys.exit(EXIT_OK)
    timeout = rt.shutdown_timeout + 10 if timeout_s is None else timeout_s
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        click.echo("mqd is not running")
        sys.exit(EXIT_OK)
    except PermissionError:
        _die(f"error: not allowed to signal pid {pid} (run as its user)", EXIT_FAIL)
    click.echo(f"stopping mqd (pid {pid}), waiting up to {timeout:.0f}s for the drain ...")
    t0 = time.monotonic()
    if not _wait_gone(rt, pid, timeout):
        if not force:
            _die(
                f"mqd (pid {pid}) is still running after {timeout:.0f}s; `mqd stop --force` kills it",
                EXIT_FAIL,
            )
        os.kill(pid, signal.SIGKILL)
        _wait_gone(rt, pid, 10)
        _die(
            f"mqd (pid {pid}) killed after {timeout:.0f}s; buffered records were not landed and will be "
            "fetched again",
            EXIT_FAIL,
        )
    last = read_json(rt.state_dir / "last_exit.json") or {}
    took = time.monotonic() - t0
    if last.get("pid") == pid and last.get("clean"):
        stats = last.get("stats") or {}
        landed = stats.get("records_published", stats.get("records"))
        extra = f"; it landed {landed} records since it started" if isinstance(landed, int) else ""
        click.echo(f"mqd stopped cleanly in {took:.1f}s{extra}")
        sys.exit(EXIT_OK)
    if last.get("pid") == pid:
        _die(f"mqd stopped with exit code {last.get('exit_code')}: {last.get('reason')}", EXIT_FAIL)
    _die(f"mqd (pid {pid}) is gone but left no exit record in {rt.state_dir}", EXIT_FAIL)


def _wait_gone(rt: _Runtime, pid: int, timeout: float) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _running(rt) != pid:
            try:
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return True
            except psutil.NoSuchProcess:
                return True
        time.sleep(0.05)
    return False


def _fetch_status(rt: _Runtime, pid: int) -> dict[str, Any]:
    url = _admin_url(rt, pid)
    if url is None:
        raise click.ClickException("the admin endpoint is disabled (admin.enabled = false)")
    data = _http("GET", f"{url}/status", token=rt.admin_token)
    if not isinstance(data, dict):
        raise click.ClickException(f"GET {url}/status: not a JSON object")
    return data


_SORT_OPTION = click.option(
    "--sort",
    type=click.Choice(["partition", "lag", "rate", "time-lag"]),
    default="partition",
    show_default=True,
    help="Row order of the live view (lag, rate, time-lag: largest first).",
)


@main.command()
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print the full status JSON.")
@click.option("--watch", "-w", is_flag=True, help="Live view, refreshed every --interval (= `mqd top`).")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1))
@_SORT_OPTION
@click.option("--iterations", type=int, default=None, hidden=True)
def status(
    config_path: Path, as_json: bool, watch: bool, interval: float, sort: str, iterations: int | None
) -> None:
    """Show whether the daemon runs and how it is doing.

    Exit code: 0 healthy, 1 degraded (or its admin endpoint does not answer), 3 not running,
    4 stuck: a partition landed nothing for consumer.stuck_intervals log-end polls (every
    consumer.log_end_interval) while its log end grew (paused, parked, failing or held back); it
    wins over 1, since a lag alert wants to know.

    \b
    Examples:
      mqd status --config config/mqd.toml
      mqd status -c config/mqd.toml --json | jq .health
      mqd status -c config/mqd.toml --watch
    """
    rt = _runtime(config_path)
    if watch:
        _watch(rt, interval, iterations, sort)
        return
    pid = _running(rt)
    if pid is None:
        _not_running(rt, as_json)
    try:
        data = _fetch_status(rt, pid)
    except click.ClickException as exc:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "state": "running",
                        "pid": pid,
                        "health": {
                            "status": "degraded",
                            "reasons": [f"admin endpoint unreachable: {exc.message}"],
                        },
                    }
                )
            )
        else:
            click.echo(f"mqd is running (pid {pid}) but its admin endpoint does not answer: {exc.message}")
        sys.exit(EXIT_FAIL)
    healthy = (data.get("health") or {}).get("status") == "ok"
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        from mqd.operator.views import render_summary

        click.echo(render_summary(data))
    totals = ((data.get("consumer") or {}).get("totals")) or {}
    if totals.get("stuck"):
        sys.exit(EXIT_STUCK)
    sys.exit(EXIT_OK if healthy else EXIT_FAIL)


@main.command()
@_config_option
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1))
@_SORT_OPTION
@click.option("--iterations", type=int, default=None, hidden=True)
def top(config_path: Path, interval: float, sort: str, iterations: int | None) -> None:
    """Live view: per partition its state, pull node, exact offsets (position, committed, landed, log
    end), lag (log end minus landed, as kafka-consumer-groups), fetch lag, time lag (age of the oldest
    record not landed, 0 when caught up), rate and error; a header with group, uptime, records/s, CPU,
    RSS and budget.
    Keeps running across daemon restarts. Keys on a terminal: s next sort order, q (or Ctrl-C) quits.

    \b
    Examples:
      mqd top --config config/mqd.toml
      mqd top -c config/mqd.toml --sort lag
    """
    _watch(_runtime(config_path), interval, iterations, sort)


def _watch(rt: _Runtime, interval: float, iterations: int | None, sort: str = "partition") -> None:
    from mqd.operator import top as top_view
    from mqd.process.runner import read_json

    def read() -> top_view.Reading:
        pid = _running(rt)
        if pid is None:
            last = read_json(rt.state_dir / "last_exit.json")
            why = "daemon not running"
            if last:
                why += f" (last exit: code {last.get('exit_code')}, {last.get('reason')})"
            return top_view.Reading(None, None, why)
        try:
            return top_view.Reading(_fetch_status(rt, pid), pid)
        except click.ClickException as exc:
            return top_view.Reading(None, pid, f"daemon (pid {pid}) does not answer: {exc.message}")

    # click.Choice let only the SORT_KEYS through
    top_view.run(read, interval=interval, iterations=iterations, sort=cast(top_view.SortKey, sort))


@main.command()
@_config_option
@click.option(
    "--wait",
    "wait_s",
    default=30.0,
    show_default=True,
    type=float,
    help="Seconds to wait for the daemon to report the result.",
)
def reload(config_path: Path, wait_s: float) -> None:
    """Re-read the config file in the running daemon (SIGHUP) and report the result.

    A valid change (topics, thresholds, log level) applies without losing data; an invalid file is
    refused and the daemon keeps its running config. The file is checked here first.

    \b
    Example:
      mqd reload --config /etc/mqd/mqd.toml      # or: systemctl reload mqd
    """
    _load(config_path)  # an invalid file: say so here (exit 2), do not bother the daemon
    rt = _runtime(config_path)
    pid = _running(rt)
    if pid is None:
        _not_running(rt)
    try:
        before = (_fetch_status(rt, pid).get("runner") or {}).get("reload", {}).get("count")
    except click.ClickException:
        before = None
    os.kill(pid, signal.SIGHUP)
    if before is None:
        click.echo(f"SIGHUP sent to mqd (pid {pid}); its log says how the reload went")
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            rel = (_fetch_status(rt, pid).get("runner") or {}).get("reload", {})
        except click.ClickException:
            continue
        if (rel.get("count") or 0) > before:
            if rel.get("ok"):
                click.echo("config reloaded")
                return
            _die(f"reload refused, the daemon keeps its running config:\n{rel.get('error')}", EXIT_FAIL)
    _die(f"mqd (pid {pid}) did not report a reload within {wait_s:.0f}s", EXIT_FAIL)


def _pause_resume(config_path: Path, partitions: tuple[str, ...], action: str) -> None:
    from mqd.operator.admin import AdminError, parse_partition_spec

    try:
        for p in partitions:
            parse_partition_spec(p)
    except AdminError as exc:
        _die(f"error: {exc}", EXIT_CONFIG)
    rt = _runtime(config_path)
    pid = _running(rt)
    if pid is None:
        _not_running(rt)
    url = _admin_url(rt, pid)
    if url is None:
        _die("error: the admin endpoint is disabled (admin.enabled = false)", EXIT_FAIL)
    try:
        res = _http("POST", f"{url}/{action}", {"partitions": list(partitions)}, token=rt.admin_token)
    except click.ClickException as exc:
        _die(f"error: {exc.message}", EXIT_FAIL)
    key = "paused" if action == "pause" else "resumed"
    done = ", ".join(f"{d['topic']}:{d['partition']}" for d in res.get(key, []))
    click.echo(f"{key}: {done or 'nothing'}")


@main.command()
@_config_option
@click.argument("partitions", nargs=-1, required=True, metavar="TOPIC[:PARTITION]...")
def pause(config_path: Path, partitions: tuple[str, ...]) -> None:
    """Stop fetching partitions of the running daemon (a bare topic: all its owned partitions).

    Buffered records of a paused partition are still landed; nothing is skipped.

    \b
    Examples:
      mqd pause -c config/mqd.toml events:3
      mqd pause -c config/mqd.toml events clicks:0
    """
    _pause_resume(config_path, partitions, "pause")


@main.command()
@_config_option
@click.argument("partitions", nargs=-1, required=True, metavar="TOPIC[:PARTITION]...")
def resume(config_path: Path, partitions: tuple[str, ...]) -> None:
    """Fetch paused partitions again.

    \b
    Example:
      mqd resume -c config/mqd.toml events:3
    """
    _pause_resume(config_path, partitions, "resume")


# -- config -----------------------------------------------------------------------------------------


@main.group()
def config() -> None:
    """Config file tools."""


@config.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--show",
    is_flag=True,
    help="Print the effective config (defaults and MQD_* applied) as JSON, durations and sizes with units.",
)
def config_check(files: tuple[Path, ...], show: bool) -> None:
    """Validate config files: a daemon file, a broker node file or a cluster layout (told by its keys).

    Exit code 0 when every file is valid, 2 otherwise (each problem names the file and key path).

    \b
    Examples:
      mqd config check config/mqd.toml
      mqd config check config/*.toml
      MQD_CONSUMER__GROUP=etl mqd config check --show /etc/mqd/mqd.toml
    """
    from mqd.config import MqdConfig, check_file, shown
    from mqd.spark.table_format import table_format_problem

    failed = False
    for path in files:
        try:
            kind, model = check_file(path)
            problem = table_format_problem(model) if isinstance(model, MqdConfig) else None
            if problem is not None:
                raise ConfigError(f"{path}: {problem}")
        except ConfigError as exc:
            failed = True
            click.echo(f"error: {exc}", err=True)
            continue
        click.echo(f"{path}: ok ({kind} config)")
        if show:
            # durations and sizes in the units syntax, so what is shown can be pasted back
            click.echo(json.dumps(_masked(shown(model)), indent=2))  # type: ignore[arg-type]
    sys.exit(EXIT_CONFIG if failed else EXIT_OK)


def _masked(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: ("<hidden>" if "token" in k and v else _masked(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [_masked(v) for v in data]
    return data


# -- landing --------------------------------------------------------------------------------------


@main.group()
def landing() -> None:
    """Landing directory tools."""


@landing.command("migrate")
@_config_option
@click.option(
    "--dir",
    "landing_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="The landing directory [default: landing.dir of the config].",
)
def landing_migrate(config_path: Path, landing_dir: Path | None) -> None:
    """Migrate a landing directory to this mqd's format (3: the claim chain), in place.

    Stop every daemon that publishes into the landing first (a daemon of the old format refuses a
    migrated landing; this one refuses an unmigrated one). Each partition's published files become
    its claim chain's archive and floor; data files keep their names and places. Files landed
    before log incarnations (format 1) get no incarnation (null in the table's incarnation column).
    Running it again does nothing; after a crash, running it again finishes it. Exit code 0 when
    the landing is in the current format afterwards, 1 otherwise.

    \b
    Examples:
      mqd landing migrate -c /etc/mqd/mqd.toml
      mqd landing migrate --dir /data/landing
    """
    from mqd.errors import MqdError
    from mqd.landing.local_migration import migrate

    root = landing_dir if landing_dir is not None else _load(config_path).landing.dir
    if not Path(root).is_dir():
        _die(f"no landing directory at {root}", EXIT_FAIL)
    try:
        done = migrate(Path(root))
    except (MqdError, OSError) as exc:  # LandingCorrupt, a format-2 daemon's lock still held, ...
        _die(f"migration of {root} failed: {exc}", EXIT_FAIL)
    if done.from_version == done.to_version:
        click.echo(f"{root}: already landing format {done.to_version}; nothing to do")
    else:
        click.echo(
            f"{root}: migrated from landing format {done.from_version} to {done.to_version} "
            f"({done.states} partitions converted to a claim chain)"
        )
    sys.exit(EXIT_OK)


@landing.command("clean")
@_config_option
@click.option(
    "--deregister", "deregister_query", default=None, metavar="QUERY", help="Remove a query's record."
)
@click.option("--list", "list_only", is_flag=True, help="List the registered queries; delete nothing.")
def landing_clean(config_path: Path, deregister_query: str | None, list_only: bool) -> None:
    """Delete (or archive) the landed files every registered Spark query has committed.

    The Spark job registers its queries in the landing (_lifecycle/queries/) and records what each
    has committed by its checkpoint; a file goes only once every registered query committed it
    (a stopped query holds everything back; with no query registered nothing goes), the newest
    file of each partition stays. Then each partition's claim chain is compacted.
    landing.lifecycle.archive_dir moves files there instead; landing.lifecycle.retention also
    deletes older files no matter what (data loss, counted). --deregister QUERY removes a query
    that will not run again (its files stop being held back). Exit code 0, 1 on a store error.

    \b
    Examples:
      mqd landing clean -c /etc/mqd/mqd.toml
      mqd landing clean -c /etc/mqd/mqd.toml --list
      mqd landing clean -c /etc/mqd/mqd.toml --deregister mqd-events-quarantine
    """
    from mqd.errors import MqdError
    from mqd.landing import lifecycle
    from mqd.landing.backends import open_store

    config = _load(config_path)
    lc, s3 = config.landing.lifecycle, config.landing.s3
    try:
        store = open_store(str(config.landing.dir), endpoint_url=s3.endpoint_url, region=s3.region)
        if deregister_query is not None:
            if not lifecycle.deregister(store, deregister_query):
                _die(f"{deregister_query}: no such registered query", EXIT_FAIL)
            click.echo(f"{deregister_query}: deregistered")
            sys.exit(EXIT_OK)
        if list_only:
            for row in lifecycle.describe(lifecycle.records(store).values()):
                click.echo(json.dumps(row))
            sys.exit(EXIT_OK)
        result = lifecycle.Cleaner(
            store, archive_dir=lc.archive_dir, retention_ms=int(lc.retention * 1000) or None
        ).clean()
    except (MqdError, OSError, ValueError) as exc:
        _die(f"cleaning {config.landing.dir} failed: {exc}", EXIT_FAIL)
    click.echo(
        f"{store.location}: {result.deleted} deleted, {result.archived} archived, {result.expired} "
        f"expired by retention, {result.compacted} claims compacted; queries: "
        f"{', '.join(result.queries) or 'none registered (nothing deleted)'}"
    )
    sys.exit(EXIT_OK)


@landing.command("check")
@_config_option
@click.option(
    "--dir",
    "landing_dir",
    default=None,
    metavar="PATH|s3://BUCKET/PREFIX",
    help="The landing [default: landing.dir of the config; then the config is not read].",
)
@click.option("--endpoint-url", default=None, help="With --dir s3://...: the S3-compatible endpoint.")
@click.option("--region", default=None, help="With --dir s3://...: the S3 region.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def landing_check(
    config_path: Path, landing_dir: str | None, endpoint_url: str | None, region: str | None, as_json: bool
) -> None:
    """List every broken link of the landing's claim chains; read-only.

    A claim deleted, overwritten (by an older claim, or junk), or not starting where the claim
    before it ended stops the Spark job and the daemon at that partition, naming the first broken
    object; this lists all of them, and the visible data files no claim names (a claim deleted at
    the head of its chain). Read and List permissions suffice. Exit code 0 when every chain is
    whole, 1 when a link is broken (or the store does not answer), 2 on bad usage.

    \b
    Examples:
      mqd landing check -c /etc/mqd/mqd.toml
      mqd landing check --dir /data/landing
      mqd landing check --dir s3://bucket/landing --endpoint-url http://127.0.0.1:8333 --json
    """
    from mqd.errors import MqdError
    from mqd.landing.chain_check import check_landing, is_landing
    from mqd.landing.objects import Objects

    if landing_dir is None:
        config = _load(config_path)
        root = str(config.landing.dir)
        endpoint_url = endpoint_url or config.landing.s3.endpoint_url
        region = region or config.landing.s3.region
    else:
        root = landing_dir
    objects: Objects
    try:
        if root.startswith("s3://"):
            from mqd.landing.s3_objects import S3Objects

            objects = S3Objects(root, endpoint_url=endpoint_url, region=region)
        else:
            from mqd.landing.local_objects import LocalObjects

            if not Path(root).is_dir():
                _die(f"no landing directory at {root}", EXIT_CONFIG)
            objects = LocalObjects(Path(root))
        if not is_landing(objects):
            _die(f"{root}: not a landing (no _format.json and no claim chains under _log/)", EXIT_CONFIG)
        result = check_landing(objects)
    except (MqdError, OSError, ValueError) as exc:
        _die(f"checking {root} failed: {exc}", EXIT_FAIL)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        for b in result.broken:
            click.echo(f"{result.location}/{b.key}: {b.problem}")
        click.echo(
            f"{result.location}: {result.chains} chains, {result.claims} claims, {result.archived} archived "
            f"lines, {result.visible} visible files checked; {len(result.broken)} broken"
        )
    sys.exit(EXIT_FAIL if result.broken else EXIT_OK)


@landing.command("query")
@_config_option
@click.option("--engine", type=click.Choice(["duckdb", "polars"]), default="duckdb", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@click.argument("sql", required=False)
def landing_query(config_path: Path, engine: str, as_json: bool, sql: str | None) -> None:
    """SQL over the landing's Delta table (landing.table = "delta"), named `landing`.

    Without SQL: records, first and last offset and newest timestamp per partition. DuckDB reads
    it with its delta extension, Polars with scan_delta; both read only what the table's log
    lists. Exit code 0, 1 when there is no table or the query fails.

    \b
    Examples:
      mqd landing query -c /etc/mqd/mqd.toml
      mqd landing query -c /etc/mqd/mqd.toml "SELECT count(*) FROM landing WHERE dt = '2026-12-02'"
      mqd landing query -c /etc/mqd/mqd.toml --engine polars --json "SELECT * FROM landing LIMIT 5"
    """
    from mqd.errors import MqdError
    from mqd.landing import delta_log, table_query

    config = _load(config_path)
    uri = delta_log.table_uri(config.landing.dir)
    s3 = config.landing.s3
    try:
        result = table_query.query(
            uri, sql or table_query.DEFAULT_SQL, engine=engine, endpoint_url=s3.endpoint_url, region=s3.region
        )
    except (MqdError, OSError) as exc:
        _die(f"query failed: {exc}", EXIT_FAIL)
    if as_json:
        for row in result.to_pylist():
            click.echo(json.dumps(row, default=lambda v: v.hex() if isinstance(v, bytes) else str(v)))
    else:
        import polars as pl

        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
            click.echo(pl.from_arrow(result))
    sys.exit(EXIT_OK)


# -- cluster and spark --------------------------------------------------------------------------------


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The node's TOML file (see config/).",
)
def broker(config_path: Path) -> None:
    """Run one broker node in the foreground.

    \b
    Example:
      mqd broker --config config/single.toml
    """
    from mqd.memory_trim import exec_with_trimmable_allocator

    exec_with_trimmable_allocator()  # before the heavy imports: the node's memory after load
    from mqd.broker.server import run_node

    try:
        run_node(config_path)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.command("broker-credentials")
@click.option(
    "--cluster",
    "cluster_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The cluster layout (e.g. config/cluster-3g.toml).",
)
@click.option(
    "--out-dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Where to write <node>.credentials.toml (one 0600 file per node).",
)
@click.option("--cluster-id", default=None, help="Cluster id to put in the files [default: a new uuid].")
def broker_credentials(cluster_path: Path, out_dir: Path, cluster_id: str | None) -> None:
    """Generate replica credentials: a secret per broker node, shared only with its replica peers.

    Every node of a broker group with slaves needs its file (``replica_credentials`` in its node
    config; a lone master gets one too, unused): replica calls are signed with it, so no client
    token, other node or process at a peer's address can report replica progress or pose as the
    master. Copy each file to its node only (mode 0600). Running it again makes new secrets:
    install the new files on every node.

    \b
    Example:
      mqd broker-credentials --cluster config/cluster-3g.toml --out-dir /etc/mqd/credentials
    """
    from mqd.broker.replica_auth import generate_credentials
    from mqd.config import load_cluster_config

    try:
        cluster = load_cluster_config(cluster_path)
    except ConfigError as exc:
        _die(f"error: {exc}", EXIT_CONFIG)
    try:
        written = generate_credentials(cluster, out_dir, cluster_id=cluster_id, lone_masters=True)
    except OSError as exc:
        _die(f"error: cannot write credentials into {out_dir}: {exc}", EXIT_FAIL)
    for node_id, path in written.items():
        click.echo(f"{node_id}: {path}")


@main.command("broker-init")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The node's TOML file.",
)
def broker_init(config_path: Path) -> None:
    """Mark a broker node's data dir as its own (writes <data_dir>/node.json).

    A master with slaves that starts without this marker (a new or replaced disk) refuses writes
    until it has consulted a slave and copied back what its log lacks. Run this to provision a new
    node, or to let such a master take writes with the log it has when no slave can be reached
    (records only the unreachable slaves held are then not on this master). A running node sees
    the marker within a second.

    \b
    Example:
      mqd broker-init --config /etc/mqd/broker-broker-a-master.toml
    """
    from mqd.broker.node_marker import check_marker, read_marker, write_marker
    from mqd.broker.replica_auth import load_credentials
    from mqd.config import load_broker_config

    try:
        cfg, _ = load_broker_config(config_path)
        cluster_id = None
        if cfg.replica_credentials is not None:
            cluster_id = load_credentials(cfg.replica_credentials, cfg.node_id, []).cluster_id
        marker = read_marker(cfg.data_dir)
        if marker is not None:
            check_marker(marker, cfg.data_dir, cfg.node_id, cluster_id)
            click.echo(f"{cfg.data_dir}: already marked as node {cfg.node_id} ({marker.created_by})")
            return
        write_marker(cfg.data_dir, cfg.node_id, cluster_id, "provisioned")
    except ConfigError as exc:
        _die(f"error: {exc}", EXIT_CONFIG)
    except OSError as exc:
        _die(f"error: cannot write the node marker into {cfg.data_dir}: {exc}", EXIT_FAIL)
    click.echo(f"{cfg.data_dir}: marked as the data dir of node {cfg.node_id}")


@main.command()
@click.option(
    "--bootstrap", default="http://127.0.0.1:9400", show_default=True, help="Any broker node's URL."
)
@click.option("--topic", required=True)
@click.option("--count", default=1000, show_default=True, type=int)
@click.option("--size", default=100, show_default=True, type=int, help="Value size in bytes.")
@click.option(
    "--rate", default=0.0, show_default=True, type=float, help="Records per second, 0 = as fast as possible."
)
@click.option(
    "--keys",
    default=0,
    show_default=True,
    type=int,
    help="Number of distinct keys (0 = no keys; keyed records hash to a partition).",
)
@click.option("--batch", default=1000, show_default=True, type=int, help="Records per batch.")
@click.option("--acks", default="all", type=click.Choice(["master", "all"]), show_default=True)
@click.option("--token", envvar="MQD_TOKEN", default=None, help="Bearer token, if the cluster needs one.")
@click.option(
    "--retries",
    default=3,
    show_default=True,
    type=int,
    help="Attempts after the first for a batch whose partition fails (with backoff); a partition "
    "that still fails is given up and its remaining records are counted as failed.",
)
def produce(**options: Any) -> None:
    """Produce test records to a topic.

    On a terminal a progress line (sent, acked, failed, records/s) is refreshed every second; a
    summary is printed at the end. A partition whose master is down does not stop the others.

    \b
    Example:
      mqd produce --topic events --count 100000 --size 100 --rate 50000

    Exit codes: 0 every record acknowledged, 1 a broker failure or records not acknowledged (one line
    per failed partition on stderr), 2 bad arguments.
    """
    from mqd.operator.produce_command import produce_cli

    sys.exit(produce_cli(**options))  # the options are produce_cli's parameters, by name


@main.command()
@_config_option
@click.option("--once", is_flag=True, help="Process what has landed (availableNow trigger), then exit.")
@click.option("--master", default=None, help="Spark master URL [default: spark.master of the config].")
def spark(config_path: Path, once: bool, master: str | None) -> None:
    """Run the Spark job that appends landed Parquet files into the output table.

    \b
    Examples:
      mqd spark --config config/mqd.toml --once
      mqd spark -c config/mqd.toml --master spark://spark-master:7077

    Exit codes: 0 done or stopped, 1 a query failed, 2 invalid configuration or pyspark not installed
    (pip install 'mqd[spark]'), 75 no Spark session
    (master unreachable or Spark failed to start; try again later).
    """
    cfg = _load(config_path)
    from mqd.spark import pyspark_problem

    missing = pyspark_problem()  # pyspark is the optional extra mqd[spark]
    if missing is not None:
        _die(missing, EXIT_CONFIG)
    from mqd import log as mqdlog
    from mqd.spark.job import run as run_job

    mqdlog.configure(cfg.log.level, cfg.log.format)
    rc = run_job(cfg, once=once, master=master)
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)


# -- table (the Delta table's maintenance; mqd/spark/table_maintenance.py) --------------------------


@main.group()
def table() -> None:
    """The output table: describe it, compact it, vacuum it, convert an old parquet table to Delta."""


def _table_session(cfg: Any) -> Any:
    """A Spark session for one table command, with Delta (and the job's lock held by the caller)."""
    from mqd.spark import pyspark_problem

    missing = pyspark_problem()
    if missing is not None:
        _die(missing, EXIT_CONFIG)
    from mqd.spark.session import SessionError, open_session

    try:
        return open_session(
            cfg.model_copy(update={"spark": cfg.spark.model_copy(update={"table_format": "delta"})})
        )
    except SessionError as exc:
        _die(str(exc), 75)


def _table_command(cfg: Any, action: Any) -> None:
    """Run ``action(spark)`` holding the job's lock: refused while ``mqd spark`` runs."""
    from mqd.spark.table_maintenance import TableBusy, job_lock

    try:
        with job_lock(cfg):
            spark = _table_session(cfg)
            try:
                action(spark)
            finally:
                spark.stop()
    except TableBusy as exc:
        _die(str(exc), 75)


def _delta_table(cfg: Any) -> Path:
    from mqd.spark.table_format import existing_format

    out = Path(cfg.spark.output_dir)
    found = existing_format(out)
    if found != "delta":
        what = "no table" if found is None else f"a table of format {found}"
        _die(f"{out} is {what}, not a Delta table (spark.output_dir)", EXIT_CONFIG)
    return out


def _iceberg_table(cfg: Any) -> Any:
    """The Iceberg output table through pyiceberg (no Spark), or None when the table is not Iceberg."""
    if cfg.spark.table_format != "iceberg":
        return None
    from mqd.spark.iceberg_catalog import IcebergSinkError
    from mqd.spark.iceberg_sink import IcebergSink
    from mqd.spark.job import iceberg_file_io

    sink = IcebergSink(
        str(cfg.spark.output_dir), catalog=cfg.spark.iceberg_catalog, file_io=iceberg_file_io(cfg)
    )
    try:
        return sink.start().table
    except IcebergSinkError as exc:
        _die(f"{cfg.spark.output_dir}: {exc}", EXIT_CONFIG)


def _maintenance_command(cfg: Any, on_iceberg: Any, on_delta: Any) -> None:
    """Maintain the output table holding the job's lock (refused while ``mqd spark`` runs):
    ``on_iceberg(table)`` through pyiceberg, or ``on_delta(spark, out)`` on the Delta table ``out``."""
    if cfg.spark.table_format == "iceberg":
        _iceberg_command(cfg, on_iceberg)
        return
    out = _delta_table(cfg)
    _table_command(cfg, lambda spark: on_delta(spark, out))


def _iceberg_command(cfg: Any, action: Any) -> None:
    """Run ``action(table)`` holding the job's lock: refused while ``mqd spark`` runs."""
    from mqd.spark.table_maintenance import TableBusy, job_lock

    try:
        with job_lock(cfg):
            action(_iceberg_table(cfg))
    except TableBusy as exc:
        _die(str(exc), 75)


@table.command("describe")
@_config_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def table_describe(config_path: Path, as_json: bool) -> None:
    """Version, files, bytes, rows and partition columns of the table (Delta: read by delta-rs;
    Iceberg: its current snapshot, by pyiceberg; no Spark, safe while the job runs)."""
    from dataclasses import asdict

    from mqd.spark.table_maintenance import describe

    cfg = _load(config_path)
    iceberg = _iceberg_table(cfg)
    if iceberg is not None:
        from mqd.spark.iceberg_maintenance import describe as describe_iceberg

        info = describe_iceberg(iceberg)
    else:
        info = describe(_delta_table(cfg))
    if as_json:
        click.echo(json.dumps(asdict(info)))
        return
    fmt = "iceberg" if iceberg is not None else "delta"
    click.echo(f"table:   {cfg.spark.output_dir} ({fmt}, version {info.version})")
    click.echo(f"files:   {info.files} ({info.bytes:,} bytes)")
    click.echo(f"rows:    {'unknown' if info.rows is None else f'{info.rows:,}'}")
    click.echo(f"partitioned by: {', '.join(info.partition_columns) or '-'}")
    click.echo(f"last operation: {info.last_operation or '-'}")


@table.command("optimize")
@_config_option
def table_optimize(config_path: Path) -> None:
    """Compact small files to about spark.target_file_size (Delta OPTIMIZE; Iceberg: a rewrite of
    each partition's small files). Refused while the job runs: it does this itself every
    spark.maintenance_interval."""
    from mqd.spark.table_maintenance import optimize

    cfg = _load(config_path)

    def compact_iceberg(table: Any) -> None:
        from mqd.spark.iceberg_maintenance import compact

        r = compact(table, cfg.spark.target_file_size)
        click.echo(
            f"{cfg.spark.output_dir}: {r.files_removed} files compacted into {r.files_added} "
            f"({r.partitions_compacted} partitions)"
        )

    def optimize_delta(spark: Any, out: Path) -> None:
        r = optimize(spark, out, cfg.spark.target_file_size)
        parts = r.partitions_optimized
        click.echo(f"{out}: {r.files_removed} files compacted into {r.files_added} ({parts} partitions)")

    _maintenance_command(cfg, compact_iceberg, optimize_delta)


@table.command("vacuum")
@_config_option
def table_vacuum(config_path: Path) -> None:
    """Delete files no version younger than spark.vacuum_retention needs (Delta VACUUM; Iceberg:
    snapshot expiry and the files only expired snapshots listed). Refused while the job runs."""
    from mqd.spark.table_maintenance import vacuum

    cfg = _load(config_path)

    def expire_iceberg(table: Any) -> None:
        from mqd.spark.iceberg_maintenance import expire

        r = expire(table, cfg.spark.vacuum_retention)
        click.echo(
            f"{cfg.spark.output_dir}: {r.snapshots_expired} snapshots expired, {r.files_deleted} files "
            f"deleted (retention {cfg.spark.vacuum_retention / 3600:g} h)"
        )

    def vacuum_delta(spark: Any, out: Path) -> None:
        vacuum(spark, out, cfg.spark.vacuum_retention / 3600)
        click.echo(f"{out}: vacuumed (retention {cfg.spark.vacuum_retention / 3600:g} h)")

    _maintenance_command(cfg, expire_iceberg, vacuum_delta)


@table.command("convert")
@_config_option
def table_convert(config_path: Path) -> None:
    """Make an old parquet table (spark.output_dir, and the quarantine table) a Delta table in place,
    from the files its _spark_metadata lists; the job's checkpoint stays valid. Idempotent. Then set
    spark.table_format = "delta". Refused while the job runs."""
    from mqd.spark.table_format import existing_format
    from mqd.spark.table_maintenance import convert

    cfg = _load(config_path)
    sc = cfg.spark
    tables = [Path(sc.output_dir)] + ([Path(sc.quarantine_dir)] if sc.has_dead_letters else [])
    tables = [t for t in tables if existing_format(t) is not None]
    if not tables:
        _die(f"no table at {sc.output_dir} to convert", EXIT_CONFIG)

    def act(spark: Any) -> None:
        for t in tables:
            was = existing_format(t)
            convert(spark, t, _partition_ddl(spark, t))
            click.echo(f"{t}: {was} -> {existing_format(t)}")

    _table_command(cfg, act)


def _partition_ddl(spark: Any, path: Path) -> str:
    """The partition columns of a parquet table as DDL (``topic STRING, dt DATE``), as Spark infers
    them from its folder names."""
    df = spark.read.parquet(str(path))
    cols: list[str] = []
    level = path
    while True:
        sub = next((p for p in level.iterdir() if p.is_dir() and "=" in p.name), None)
        if sub is None:
            break
        cols.append(sub.name.split("=", 1)[0])
        level = sub
    types = {f.name: f.dataType.simpleString().upper() for f in df.schema.fields}
    return ", ".join(f"`{c}` {types[c]}" for c in cols)


# -- offsets (deliberate replays and skips; mqd/operator/offsets_command.py) -----------------------


@main.group()
def offsets() -> None:
    """Where the daemon resumes: show it, move it (the landing, not the broker commit, decides)."""


def _offsets_run(config_path: Path, work: Any) -> None:
    """Run ``work(tool)`` against the config's queue and landing; errors exit 1 (2: config)."""
    import asyncio

    from mqd.consumer.errors import ConsumerError
    from mqd.operator.offsets_command import OffsetsTool
    from mqd.process.reset_records import ResetError

    cfg = _load(config_path)

    async def go() -> None:
        tool = OffsetsTool(cfg)
        try:
            await tool.start()
            await work(tool)
        finally:
            await tool.stop()

    try:
        asyncio.run(go())
    except (ResetError, ConsumerError) as exc:
        _die(f"error: {exc}", EXIT_FAIL)


@offsets.command("show")
@_config_option
@click.argument("partitions", nargs=-1, metavar="TOPIC[:PARTITION]...")
def offsets_show(config_path: Path, partitions: tuple[str, ...]) -> None:
    """Show each partition's landed position (where the daemon resumes), the broker-committed
    offset, the log bounds and any reset not applied yet. Default: the config's topics.

    \b
    Example:
      mqd offsets show --config config/mqd.toml events
    """
    from mqd.operator.offsets_command import parse_partitions, table
    from mqd.topic_pattern import TopicSubscription

    async def work(tool: Any) -> None:
        known = tool.partitions_of()
        # the config's topics, its re: patterns resolved; names not in the metadata are reported
        names = partitions or TopicSubscription(_load(config_path).consumer.topics).resolve(known)
        tps = parse_partitions(names, known)
        click.echo(table(await tool.rows(tps), with_new=False))

    _offsets_run(config_path, work)


@offsets.command("reset")
@_config_option
@click.argument("partitions", nargs=-1, required=True, metavar="TOPIC[:PARTITION]...")
@click.option(
    "--to", "to", required=True, help="earliest | latest | an offset | an ISO datetime (UTC if no zone)."
)
@click.option("--dry-run", is_flag=True, help="Print the table of what would change; change nothing.")
def offsets_reset_cmd(config_path: Path, partitions: tuple[str, ...], to: str, dry_run: bool) -> None:
    """Move where the daemon resumes, per topic or TOPIC:PARTITION, with the daemon stopped.

    The landing is the source of truth, so the reset is recorded in the landing (a broker-side
    `kafka-consumer-groups --reset-offsets` is only warned about at start). A forward reset skips
    offsets (logged and counted when the daemon applies it); a reset below what is landed is a
    deliberate replay: the range lands once more, its rows marked by a replay id in the table's
    incarnation column. Stop every daemon of the group first. Exit codes: 0 done, 1 refused or
    failed, 2 invalid configuration.

    \b
    Examples:
      mqd offsets reset -c config/mqd.toml events --to latest --dry-run
      mqd offsets reset -c config/mqd.toml events:3 --to 150000
      mqd offsets reset -c config/mqd.toml events --to 2026-11-24T08:00:00Z
    """
    import uuid

    from mqd.operator.offsets_command import now_iso, parse_partitions, parse_target, plan_row, table
    from mqd.process.reset_records import ResetError, ResetRecord, write_reset

    try:
        target = parse_target(to)
    except ResetError as exc:
        _die(f"error: {exc}", EXIT_CONFIG)
    rt = _runtime(config_path)
    if not dry_run and (pid := _running(rt)) is not None:
        _die(
            f"error: the daemon is running (pid {pid}); stop it first (`mqd stop`), and every other "
            "daemon of its group: a running daemon would land past the reset",
            EXIT_FAIL,
        )
    refused = False

    async def work(tool: Any) -> None:
        nonlocal refused
        root = tool.landing  # the landing's objects: a directory or s3://
        tps = parse_partitions(partitions, tool.partitions_of())
        rows = await tool.rows(tps)
        targets = await tool.targets(tps, target)
        heads = await tool.heads(tps)
        plan = []
        for row in rows:
            assert row.log_start is not None and row.log_end is not None
            plan.append(
                plan_row(
                    row.tp,
                    landed_next=row.landed_next,
                    committed=row.committed,
                    log_start=row.log_start,
                    log_end=row.log_end,
                    pending=row.pending,
                    target=targets[row.tp],
                    landed_incarnation=heads[row.tp][1],
                    replaying=heads[row.tp][2],
                )
            )
        click.echo(table(plan, with_new=True))
        refused = any(p.action == "refused" for p in plan)
        if dry_run:
            click.echo("dry run: nothing changed")
            return
        if refused:
            click.echo("nothing changed: a partition is refused (see NOTE)", err=True)
            return
        moved = 0
        for p in plan:
            if p.action not in ("move", "replay"):
                continue
            assert p.new is not None
            replay = p.action == "replay" and p.landed_next is not None
            rec = ResetRecord(
                p.tp,
                p.new,
                p.landed_next,
                heads[p.tp][1],
                now_iso(),
                # the replayed range lands under its own id: the landed files keep theirs
                replay_id=uuid.uuid4().hex if replay else None,
                replay_end=p.landed_next - 1 if replay and p.landed_next is not None else None,
            )
            write_reset(root, rec)
            moved += 1
        click.echo(f"recorded {moved} reset(s); the daemon applies them at its next start")

    _offsets_run(config_path, work)
    sys.exit(EXIT_FAIL if refused else EXIT_OK)


if __name__ == "__main__":
    main(prog_name="mqd")
