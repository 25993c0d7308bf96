"""A real headless browser for the status page: Debian's ``chromium`` driven through its command line.

``--dump-dom`` prints the DOM after the page loaded (scripts run, styles applied), ``--screenshot``
writes a PNG; nothing is downloaded (no playwright browser bundle), and every flag that would make
the browser talk to the network on its own is off, so a run touches nothing but the URL it is given.
Each call gets a fresh profile directory and runs in its own process group, killed whole when the
call outlasts its timeout (chromium starts a zygote, a GPU and a renderer process).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",  # runs as root in CI containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
TIMEOUT_S = 60.0


class BrowserError(RuntimeError):
    """Chromium failed or outlasted its timeout; the message carries the end of its stderr."""


def find_chromium() -> str | None:
    """The browser's path (``chromium``, Debian's package; or ``chromium-browser``), None if absent."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def dump_dom(url: str, *, timeout: float = TIMEOUT_S) -> str:
    """The page's DOM as HTML once it loaded. Basic credentials go in the URL (``http://u:p@host/``)."""
    return _run(["--dump-dom", url], timeout).stdout


def screenshot(
    url: str, out: Path, *, width: int = 1280, height: int = 720, timeout: float = TIMEOUT_S
) -> None:
    """A PNG of the loaded page at ``width`` x ``height`` pixels."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--screenshot={out.resolve()}", f"--window-size={width},{height}", url], timeout)
    if not out.exists():
        raise BrowserError(f"chromium wrote no screenshot to {out}")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    exe = find_chromium()
    if exe is None:
        raise BrowserError("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="mqd-chromium-") as profile:
        proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={profile}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env={**os.environ, "HOME": profile},  # no writes to the real home's .config
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise BrowserError(f"chromium did not finish within {timeout:g}s") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            # helpers (zygote, renderer) left in the group outlive the profile otherwise
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0:
        raise BrowserError(f"chromium exited with {proc.returncode}: {err[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
