"""DiskHealth's state rules without a broken disk: which errors count, what the probe finds, and
that a probe's success never hides an error noted while it ran."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

from mqd.broker.disk_health import PROBE_FILE, DiskHealth


def test_only_disk_errnos_are_problems(tmp_path: Path) -> None:
    """ENOSPC/EROFS/EDQUOT/EIO name the disk; other errors (a bad fd, a missing file) do not."""
    disk = DiskHealth(tmp_path)
    assert not disk.note_error(OSError(errno.EBADF, "Bad file descriptor"), "write")
    assert disk.problem is None
    assert disk.note_error(OSError(errno.EROFS, "Read-only file system"), "segment roll")
    assert disk.problem is not None
    assert "segment roll failed: read-only file system (EROFS)" in disk.problem


def test_probe_writes_and_removes_its_file_and_names_a_missing_dir(tmp_path: Path) -> None:
    """A writable dir probes clean and keeps no probe file; a dir that is gone is a problem."""
    assert DiskHealth(tmp_path).probe() is None
    assert not (tmp_path / PROBE_FILE).exists()
    problem = DiskHealth(tmp_path / "gone").probe()
    assert problem is not None and "ENOENT" in problem


def test_probe_success_clears_a_problem_unless_an_error_came_meanwhile(tmp_path: Path) -> None:
    """A clean probe clears an earlier problem; an error noted while a probe runs stays."""

    async def scenario() -> tuple[str | None, str | None]:
        disk = DiskHealth(tmp_path, probe_interval=0.0)
        disk.note_error(OSError(errno.ENOSPC, "No space left on device"), "write")
        disk.probe_soon()
        await asyncio.sleep(0)  # the probe runs in a worker thread
        while disk.probing:
            await asyncio.sleep(0.01)
        cleared = disk.problem
        disk.probe_soon()
        disk.note_error(OSError(errno.EIO, "Input/output error"), "fsync")  # while it runs
        while disk.probing:
            await asyncio.sleep(0.01)
        return cleared, disk.problem

    cleared, kept = asyncio.run(scenario())
    assert cleared is None
    assert kept is not None and "EIO" in kept
