"""Landing-disk faults that work for root: a small tmpfs, filled up or bind-mounted read-only.

Tests and ``make chaos`` run as root here, where ``chmod`` stops nothing. What does stop root:

* **full**: the landing directory is a tmpfs of a few MiB; a filler file takes all free space, so
  every write gets ``ENOSPC``; deleting the filler restores it.
* **read-only**: a read-only bind mount of the directory stacked over itself makes every new open
  for writing fail with ``EROFS`` (files already open stay writable, as on a real remount);
  unmounting it restores the directory. (``mount -o remount,ro`` of the tmpfs itself is refused
  with EBUSY while a daemon holds a file open for writing, so it is not usable.)

Both need ``mount``, i.e. root (CAP_SYS_ADMIN). ``mqd_dev.chaos`` re-executes itself under
``unshare -m`` so these mounts live in a private mount namespace the kernel tears down with the run,
even when the run is killed. Without mount rights the disk faults are reported as unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
from pathlib import Path

FILLER = ".chaos-filler"  # a dot file: neither the landing reader nor Spark looks at it


def _run(*argv: str) -> tuple[bool, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


class LandingDisk:
    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        self.size_mb = size_mb
        self.available = False
        self.reason = "not set up"
        self._readonly = False
        self._mounted = False

    def setup(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.reason = "needs root (mount)"
            return
        ok, err = _run("mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path))
        if not ok:
            self.reason = f"mount -t tmpfs failed: {err}"
            return
        self._mounted = True
        self.available = True
        self.reason = f"tmpfs of {self.size_mb} MiB; full = filler file, read-only = ro bind mount"

    async def make_readonly(self) -> None:
        await asyncio.to_thread(self._make_readonly)

    def _make_readonly(self) -> None:
        # Built on a staging point nobody writes through, then moved over the landing directory: a
        # bind made in place can get a writer between bind and remount (EBUSY from the remount).
        stage = self.path.parent / f".{self.path.name}-ro-stage"
        stage.mkdir(exist_ok=True)
        ok, err = _run("mount", "--bind", str(self.path), str(stage))
        if not ok:
            raise OSError(f"bind mount failed: {err}")
        ok, err = _run("mount", "-o", "remount,bind,ro", str(stage))
        if ok:
            ok, err = _run("mount", "--move", str(stage), str(self.path))
        if not ok:
            _run("umount", "-l", str(stage))
            raise OSError(f"read-only bind mount failed: {err}")
        self._readonly = True

    async def make_writable(self) -> None:
        if not self._readonly:
            return
        ok, _err = await asyncio.to_thread(_run, "umount", str(self.path))
        if not ok:  # a process has its cwd or an open file inside: detach it anyway
            ok, err = await asyncio.to_thread(_run, "umount", "-l", str(self.path))
            if not ok:
                raise OSError(f"umount of the read-only bind failed: {err}")
        self._readonly = False

    async def fill(self) -> int:
        """Take every free byte; returns how many were written."""
        return await asyncio.to_thread(self._fill)

    def _fill(self) -> int:
        block = b"\0" * (1 << 20)
        written = 0
        with open(self.path / FILLER, "ab") as fh:
            for _ in range(1 << 16):  # bounded: the filesystem is a few MiB
                try:
                    written += os.write(fh.fileno(), block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
            # the last partial block: fill byte-exact so a small write fails too
            for size in (65536, 4096, 512, 1):
                while True:
                    try:
                        written += os.write(fh.fileno(), block[:size])
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        return written

    async def drain(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread((self.path / FILLER).unlink)

    def teardown(self) -> None:
        if self._readonly:
            _run("umount", "-l", str(self.path))
            self._readonly = False
        with contextlib.suppress(OSError):
            (self.path / FILLER).unlink()
        if self._mounted:
            _run("umount", "-l", str(self.path))
            self._mounted = False
