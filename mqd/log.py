"""structlog set-up: JSON lines under systemd or without a TTY, console output on a TTY.

structlog loggers and stdlib loggers (aiohttp, asyncio, py4j/pyspark) go through the same processors,
so every line has the same shape: ``timestamp``, ``level``, ``logger``, ``event`` and the bound
context. The pull path binds ``topic``/``partition``/``node`` with ``structlog.contextvars`` (or a
bound logger); ``merge_contextvars`` puts them on every line logged inside that context, including
lines from stdlib loggers.

Used as a library (``import mqd.consumer`` in someone's application), mqd prints nothing by itself:
``library_default`` (run when the ``mqd`` package is imported) sends structlog's events to stdlib
loggers named ``mqd.*`` and gives ``mqd`` a NullHandler, the stdlib convention for libraries. The
application decides: ``logging.basicConfig(level=logging.INFO)`` shows mqd's lines as ``event
key=value ...`` through its own handlers, ``mqd.log.configure()`` (what the ``mqd`` command runs)
gives mqd's JSON or console output. An application that configured structlog itself keeps its
configuration, and mqd's lines follow it.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
from types import TracebackType
from typing import IO, Any


def is_mqd_command() -> bool:
    """This process is the `mqd` command (its console script, or ``python -m mqd.operator.cli``),
    not an application or a test that imports mqd: only the process's owner hides what it does not
    use, as `mqd run` alone freezes its start-up (decision 061). ``sys.argv[0]`` is "-m" while
    ``-m`` imports the packages; ``sys.orig_argv`` has the module's name."""
    argv = sys.orig_argv
    if os.path.basename(sys.argv[0] if sys.argv else "") == "mqd":
        return True
    return any(a == "-m" and b == "mqd.operator.cli" for a, b in itertools.pairwise(argv))


if is_mqd_command() and "structlog" not in sys.modules and "rich" not in sys.modules:
    # structlog imports rich (and pygments) at its own import for its console tracebacks, ~0.1 s of
    # CPU before the first fetch on the 2.0 GHz Xeon (issue 34); the console output imports it at
    # its first traceback instead (_RichTraceback), `mqd top` when it starts
    sys.modules["rich"] = None  # type: ignore[assignment]
    try:
        import structlog
    finally:
        del sys.modules["rich"]
else:
    import structlog

LEVELS = ("debug", "info", "warning", "error")

# chatty libraries: their INFO lines are per request
_QUIET = {"aiohttp.access": logging.WARNING, "py4j": logging.WARNING, "py4j.clientserver": logging.WARNING}


def _level_number(level: str) -> int:
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}; allowed: {', '.join(LEVELS)}")
    return number


def under_journal(stream: IO[Any]) -> bool:
    """True when ``stream`` is the journal socket systemd connected (JOURNAL_STREAM = dev:inode)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    if not value:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return value == f"{st.st_dev}:{st.st_ino}"


def resolve_format(fmt: str, stream: IO[Any]) -> str:
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; allowed: auto, json, console")
    if fmt != "auto":
        return fmt
    try:
        tty = stream.isatty()
    except (ValueError, AttributeError):
        tty = False
    return "console" if tty and not under_journal(stream) else "json"


def shared_processors() -> list[Any]:
    """What every line gets, whether it was logged by structlog or by a stdlib logger."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]


def _final_processors(fmt: str, colors: bool) -> list[Any]:
    if fmt == "console":
        # ConsoleRenderer formats exceptions itself (and prettier than format_exc_info)
        return [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=_RichTraceback(colors)),
        ]
    return [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
        structlog.processors.format_exc_info,
        structlog.processors.UnicodeDecoder(),
        structlog.processors.JSONRenderer(default=str),
    ]


class _RichTraceback:
    """A rich traceback on the console, rich imported by the first one: the mqd command imports
    structlog without rich, and structlog's own formatter needs it at structlog's import. Locals
    are not shown (structlog's formatter shows them): a terminal's traceback gets pasted into
    issues, and a daemon's locals hold tokens and keys."""

    def __init__(self, colors: bool) -> None:
        self.color_system: Any = "truecolor" if colors else None

    def __call__(
        self, sio: IO[str], exc_info: tuple[type[BaseException], BaseException, TracebackType | None]
    ) -> None:
        from rich.console import Console
        from rich.traceback import Traceback

        sio.write("\n")
        Console(file=sio, color_system=self.color_system).print(Traceback.from_exception(*exc_info))


_pairs = structlog.processors.KeyValueRenderer(sort_keys=True)


def _event_then_pairs(logger: Any, name: str, event_dict: Any) -> tuple[tuple[str], dict[str, Any]]:
    """``event key=value ...``: the message a stdlib handler shows for a structlog event; an exception
    goes to the stdlib record's exc_info, so the application's formatter prints its traceback."""
    event = event_dict.pop("event", "")
    exc_info = event_dict.pop("exc_info", None)
    rest = _pairs(logger, name, event_dict)
    return (f"{event} {rest}" if rest else str(event),), ({"exc_info": exc_info} if exc_info else {})


def library_default() -> None:
    """Quiet unless the application configures logging; a no-op once structlog is configured.

    structlog's own default prints every level to stdout: a library must not. Events become stdlib
    records (message ``event key=value ...``) filtered by the stdlib levels, and the NullHandler keeps
    Python's last-resort handler from printing mqd's warnings on stderr when nothing is configured.
    """
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.processors.StackInfoRenderer(),
            _event_then_pairs,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    logging.getLogger("mqd").addHandler(logging.NullHandler())


def configure(level: str = "info", fmt: str = "auto", stream: IO[Any] | None = None) -> str:
    """Set up logging for the whole process; returns the format chosen ("json" or "console")."""
    stream = stream or sys.stderr
    number = _level_number(level)
    chosen = resolve_format(fmt, stream)
    shared = shared_processors()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(number),
        # not cached, so set_level() also reaches module-level loggers made before it
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=_final_processors(chosen, colors=chosen == "console"),
        )
    )
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(number)
    for name, lvl in _QUIET.items():
        logging.getLogger(name).setLevel(max(lvl, number))
    logging.captureWarnings(True)
    return chosen


def set_level(level: str) -> None:
    """Change the level at run time (config reload) without touching handlers or format."""
    number = _level_number(level)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(number))
    logging.getLogger().setLevel(number)
    for name, lvl in _QUIET.items():
        logging.getLogger(name).setLevel(max(lvl, number))
