"""`mqd top` on a real terminal (a pseudo-terminal): the screen is redrawn in place, `s` switches to
the next sort order at once and `q` quits with exit 0, and the terminal is given back in the mode it
was in (echo and line buffering on again)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import termios
from pathlib import Path

from mqd.waiting import wait_until_sync

PROGRAM = """
import sys
sys.path.insert(0, {tests!r})
from support.top_status import busy, status
from mqd.operator.top import Reading, run

data = status(*busy())
run(lambda: Reading(data, 4711), interval=0.2, iterations=3000)
"""


class Screen:
    """Everything the program wrote to the terminal so far (escape sequences included)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def pump(self) -> str:
        while select.select([self.fd], [], [], 0)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the program exited and closed its side
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        return self.text


def test_keys_switch_the_sort_order_and_quit(tmp_path: Path) -> None:
    """The footer names the sort order; `s` moves partition -> lag and the paused partition with the
    largest lag comes first; `q` ends the program with 0 and the terminal has echo back on."""
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    tests = str(Path(__file__).resolve().parents[2])  # tests/: the program imports support.top_status
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM.format(tests=tests)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"},
        close_fds=True,
    )
    screen = Screen(master)
    try:
        wait_until_sync(
            lambda: "s: sort by partition (next: lag)" in screen.pump(), timeout=30, what="the first screen"
        )
        assert termios.tcgetattr(slave)[3] & termios.ECHO == 0  # cbreak: keys are not echoed
        mark = len(screen.text)
        os.write(master, b"s")
        wait_until_sync(
            lambda: "s: sort by lag (next: rate)" in screen.pump()[mark:], timeout=10, what="lag order"
        )
        after = screen.text[mark:]
        assert after.index("events:1") < after.index("events:0")  # largest lag first
        os.write(master, b"q")
        # the terminal is drained while the program ends (its last output would block otherwise)
        wait_until_sync(lambda: bool(screen.pump()) and proc.poll() is not None, timeout=20, what="exit")
        assert proc.returncode == 0, screen.pump()
        assert "Traceback" not in screen.pump()
        assert termios.tcgetattr(slave)[3] & termios.ECHO == before[3] & termios.ECHO
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
        os.close(slave)
