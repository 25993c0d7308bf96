"""``lock_freeze``: SIGSTOP a daemon while it holds a landing lock (a VM frozen mid-publication).

A publication holds ``flock`` on ``_state/<topic>/<partition>.lock`` for a few milliseconds (the
conditional commit, mqd.landing.local_store); start positions and completeness markers take locks
there too. To freeze a daemon inside that window, a worker thread polls ``/proc/locks`` for a FLOCK
held (not waited for: no ``->``) by the daemon's pid on the inode of one of those lock files, sends
SIGSTOP at once, and reads ``/proc/locks`` again: a stopped process releases nothing, so if the lock
is still listed the freeze is inside the window; if it was released in between, the daemon is
continued and the watch goes on. The fault then lasts longer than the group session, so another
daemon takes the frozen one's partitions over and meets the held lock.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from mqd.landing import layout
from mqd_dev.chaos.procs import DaemonProc

_POLL_S = 0.0005
_RESCAN_S = 0.2  # lock files appear as partitions are first published


def lock_inodes(landing: Path) -> dict[int, Path]:
    """Every landing lock file, by inode."""
    out: dict[int, Path] = {}
    for path in (landing / layout.STATE_DIR).rglob("*.lock"):
        try:
            out[path.stat().st_ino] = path
        except OSError:
            continue
    return out


def held_flocks(locks_text: str, pid: int) -> set[int]:
    """Inodes on which ``pid`` holds a FLOCK, from the text of ``/proc/locks``."""
    out: set[int] = set()
    for line in locks_text.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK":  # "->" in parts[1]: a waiter, not a holder
            continue
        try:
            if int(parts[4]) == pid:
                out.add(int(parts[5].rsplit(":", 1)[1]))
        except (ValueError, IndexError):
            continue
    return out


def _read_locks() -> str:
    with open("/proc/locks") as fh:
        return fh.read()


def _wait_stopped(pid: int, timeout: float = 1.0) -> None:
    """Until the kernel shows ``pid`` stopped (SIGSTOP is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
        except (OSError, IndexError):
            return
        time.sleep(_POLL_S)


def freeze_in_lock(d: DaemonProc, landing: Path, timeout: float) -> Path | None:
    """Blocking (run it in a thread). SIGSTOP ``d`` while it holds a landing lock and return that
    lock's path; None if no window was hit within ``timeout`` (``d`` is then not frozen)."""
    deadline = time.monotonic() + timeout
    inodes: dict[int, Path] = {}
    rescan_at = 0.0
    while time.monotonic() < deadline:
        pid = d.pid
        if pid is None or not d.running:
            return None
        now = time.monotonic()
        if now >= rescan_at:
            inodes = lock_inodes(landing)
            rescan_at = now + _RESCAN_S
        if held_flocks(_read_locks(), pid) & inodes.keys():
            d.send_signal(signal.SIGSTOP)
            _wait_stopped(pid)
            still = held_flocks(_read_locks(), pid) & inodes.keys()
            if still:
                return inodes[min(still)]
            d.send_signal(signal.SIGCONT)  # released before the stop landed: watch on
        time.sleep(_POLL_S)
    return None
