"""Published landing files leave the page cache (issue 16): once a file is fsynced and published its
pages are dropped, so the next file's writes refill pages the kernel just freed instead of fresh ones,
and a co-located broker's log is not evicted by files only Spark reads, later. Both publication
paths are checked: the store's staged file (the daemon) and ``layout.write_parquet`` (the benchmark's
alternatives and sink ceiling, which publish the same way). A file still being staged sends its row
groups to disk as they are written (issue 34), so its final fsync does not write it whole."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pyarrow as pa
import pytest
from support.streamed_files import records, stream_three_row_groups

from mqd.landing import layout
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import file_range
from mqd.waiting import wait_until_sync

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_INT = ctypes.c_int
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _INT, _INT, _INT, ctypes.c_long]
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def resident_share(path: Path) -> float:
    """The share of ``path``'s pages in the page cache (mincore on a mapping: it faults nothing in)."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, _MAP_FAILED), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert _LIBC.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            _LIBC.munmap(addr, size)
    finally:
        os.close(fd)


def cached_control(folder: Path) -> None:
    """A file written and fsynced the ordinary way stays cached; where even that one is not (a
    filesystem without a page cache of its own), there is nothing to check."""
    control = folder / "control.bin"
    fd = os.open(control, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, os.urandom(4 << 20))
        os.fsync(fd)
    finally:
        os.close(fd)
    if resident_share(control) < 0.9:
        pytest.skip(f"{folder}'s filesystem does not keep written pages cached")


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux-only")
def test_a_published_file_leaves_the_page_cache(tmp_path: Path) -> None:
    """A ~12 MB file streamed in three row groups and published by the local store keeps (almost)
    none of its pages cached, while a file written without the drop keeps them all."""
    cached_control(tmp_path)
    store = LocalStore(tmp_path / "landing")
    store.open()
    rng = stream_three_row_groups(store, size=4000)
    published = tmp_path / "landing" / rng.path
    assert published.stat().st_size > 10 << 20
    assert resident_share(published) < 0.05


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux-only")
def test_write_parquet_leaves_the_page_cache(tmp_path: Path) -> None:
    """layout.write_parquet (the alternatives' and the sink ceiling's publication) drops its pages too,
    so the benchmark's comparison stays like for like."""
    cached_control(tmp_path)
    part = pa.concat_tables([records(i * 1000, 1000, 4000) for i in range(3)])
    path = tmp_path / "whole.parquet"
    size = layout.write_parquet(path, layout.landing_table("t", 0, part), file_range("t", 0, part), "snappy")
    assert size > 10 << 20
    assert resident_share(path) < 0.05


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux-only")
def test_a_staged_file_goes_to_disk_while_it_is_still_open(tmp_path: Path) -> None:
    """Each row group written into a local staged file starts its writeback (fsutil.start_writeback):
    once the kernel has written the first ~4 MB row group, the next write drops its pages, while the
    file is still open and long before its fsync. Without it they stay cached, dirty until that fsync
    writes the whole file while the burst waits (0.5 s for the ``wide`` shape's 48 files)."""
    cached_control(tmp_path)
    store = LocalStore(tmp_path / "landing")
    store.open()
    first = records(0, 1000, 4000)
    writer = store.open_stage(file_range("t", 0, first), "snappy")
    writer.write(layout.landing_table("t", 0, first))
    [scratch] = (tmp_path / "landing" / "_staging").rglob("mqd-stage-*")
    assert scratch.stat().st_size > 3 << 20
    written = [1000]

    def first_row_group_dropped() -> bool:
        part = records(written[0], 10)  # a small row group: its write is when pages are dropped
        writer.write(layout.landing_table("t", 0, part))
        written[0] += 10
        return resident_share(scratch) < 0.25

    try:
        wait_until_sync(first_row_group_dropped, 20.0, "the first row group's pages to leave the cache")
    finally:
        writer.abort()
