"""Durable small-file helpers shared by the broker, the consumer and the landing code."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from mqd.errors import MqdError
from mqd.waiting import wait_until_sync


class LockTimeout(MqdError):
    """A lock file stayed held by another process past the caller's bound; retry later."""

    retriable = True


def fsync_dir(path: Path) -> None:
    """fsync the folder ``path``, so the names created, renamed or removed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_written_once(path: Path) -> int:
    """fsync ``path``, a file written once and read later by someone else (a published landing file),
    drop its pages from the page cache and return its size. Keeping the pages only evicts what is
    read now (the broker's log on a shared machine); and a page the kernel reuses at once is much
    cheaper to fill than a fresh one: on this project's benchmark VM writing 32 MB cost 80 ms of CPU
    into fresh page-cache pages against 8 ms into pages just dropped
    (docs/decisions/046-files-streamed-row-groups.md, "Published files leave the page cache")."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the cache keeps them, which is only slower
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def start_writeback(path: Path) -> None:
    """Start writing ``path``'s dirty pages to disk now, without waiting, and drop its pages already
    written: for a file written once a piece at a time (a staged landing file, a row group per
    piece). Left to the kernel, a whole file's pages stay dirty until its final fsync (writeback
    starts after ~30 s), so that fsync writes the file whole while the caller waits: 0.5 s for the
    48 files a burst of the ``wide`` shape finishes together. Started after each piece, the disk
    writes during the run and the fsync waits for the last piece; the pages dropped on the way are
    reused by the next writes instead of fresh ones (see ``fsync_written_once``).
    Linux's POSIX_FADV_DONTNEED does both: writeback of the dirty pages (no wait), then the clean
    ones dropped. Elsewhere nothing happens, which is only slower."""
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the folder. A reader sees
    the old content or the new one, never a mix, also after a crash."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold an exclusive flock on the lock file ``path`` (created with its folders if missing).

    ``timeout`` None waits as long as it takes; a number bounds the wait (seconds, 0 = one try) and
    raises :class:`LockTimeout` when another holder keeps the lock past it. flock has no timed wait,
    so the bounded form polls a non-blocking flock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            try:
                wait_until_sync(lambda: _try_flock(fd), max(timeout, 0.0), f"the lock {path}", interval=0.01)
            except TimeoutError:
                raise LockTimeout(f"{path} is held by another process after {timeout:.1f}s") from None
        yield
    finally:
        os.close(fd)  # closing releases the flock
