"""The object primitives (objects.py) on a POSIX directory, so the claim chain runs unchanged on a
local (or shared POSIX) landing: one protocol, one argument, for both stores.

Each key is the file ``<root>/<key>``. Every write goes to a private temp file in the key's folder
first (``.<name>.<token>.tmp``, fsynced), so a reader never sees a torn object:

``put``            unconditional: rename the temp file over the key.
``put if_absent``  ``os.link`` the temp file to the key: the kernel creates the name only if it is
                   free (EEXIST: PreconditionFailed). No lock.
``put if_match``   compare-and-swap by etag. POSIX has no conditional rename, so a short flock on
                   ``.<name>.lock`` covers read-compare-rename of that one key (the new bytes are
                   written and fsynced before the lock is taken). The wait is bounded
                   (``cas_lock_timeout``): a holder frozen inside (SIGSTOP, a stopped VM) makes
                   others' compare-and-swap of that key fail with CommitLockTimeout (retriable),
                   never wait. Only small bookkeeping keys are swapped (the chain's floor, the
                   janitor's reap markers, idle watermarks, the marker progress); a publication
                   never takes the lock unless the janitor is deciding about the very staged file
                   it promotes (a file older than the janitor's age).
``copy``           ``os.link`` of the source to a temp name, renamed over the destination: the
                   promoted file shares the staged file's fsynced bytes, nothing is copied.

Durability: a write returns after the file and its folder are fsynced (a new folder's parent too).
Etags: ``get`` and ``put`` return a hash of the content (what ``if_match`` compares, like S3's
MD5 etags); ``head`` and listings return a weak etag from ``stat`` (``W/...``) that never matches,
so a compare-and-swap on it fails safe. Names starting with ``.`` (temp files, locks, the staging
scratch folder) are not objects: listings skip them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

from mqd import fsutil, metrics
from mqd.landing import layout
from mqd.landing.errors import CommitLockTimeout, ObjectStoreError, PreconditionFailed
from mqd.landing.objects import ObjectInfo

log = structlog.get_logger("mqd.landing.local_objects")

CAS_LOCK_TIMEOUT_S = 5.0  # a swap holds its key's lock for one small read and a rename
SCRATCH_DIR = "_staging/.scratch"  # where staged files are encoded: same filesystem, not listed
_TMP_SUFFIX = ".tmp"
_LOCK_SUFFIX = ".lock"


def _etag(data: bytes) -> str:
    return '"' + hashlib.blake2b(data, digest_size=16).hexdigest() + '"'


class LocalObjects:
    """Objects under a local directory. Thread-safe (no shared mutable state)."""

    def __init__(self, root: Path, *, cas_lock_timeout: float = CAS_LOCK_TIMEOUT_S) -> None:
        self.root = Path(root)
        self.cas_lock_timeout = cas_lock_timeout

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def scratch_dir(self) -> Path:
        """Where the object store encodes a file before ``upload`` links it into place."""
        return self.root / SCRATCH_DIR

    # -- helpers ----------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or any(part in ("", ".", "..") for part in key.split("/")):
            raise ValueError(f"bad object key {key!r}")
        return self.root / key

    def _error(self, exc: OSError, what: str) -> ObjectStoreError:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return ObjectStoreError(f"{self.root}: {what}: {name}: {exc.strerror or exc}", errno=exc.errno)

    def _folder(self, path: Path) -> None:
        if not path.parent.is_dir():
            self.root.mkdir(parents=True, exist_ok=True)
            layout.makedirs_durable(path.parent, self.root)

    def _lock(self, path: Path) -> Path:
        return path.with_name(f".{path.name}{_LOCK_SUFFIX}")

    def _temp(self, path: Path) -> Path:
        return path.with_name(f".{path.name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")

    def _write_temp(self, path: Path, data: bytes) -> Path:
        """``data`` in a fresh, fsynced temp file next to ``path``."""
        self._folder(path)
        tmp = self._temp(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    # -- the primitives ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
        except OSError as exc:
            raise self._error(exc, f"put {key}") from None
        try:
            if if_absent:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailed(f"{key}: exists") from None
            elif if_match is not None:
                self._swap(key, path, tmp, if_match)
            else:
                os.replace(tmp, path)
            fsutil.fsync_dir(path.parent)
        except OSError as exc:
            raise self._error(exc, f"put {key}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        return _etag(data)

    def _swap(self, key: str, path: Path, tmp: Path, if_match: str) -> None:
        """Rename ``tmp`` over ``path`` if its content's etag is ``if_match``, under the key's
        bounded lock (module docstring)."""
        try:
            with fsutil.locked(self._lock(path), timeout=self.cas_lock_timeout):
                try:
                    current = path.read_bytes()
                except FileNotFoundError:
                    raise PreconditionFailed(f"{key}: does not exist") from None
                if _etag(current) != if_match:
                    raise PreconditionFailed(f"{key}: etag differs")
                os.replace(tmp, path)
        except fsutil.LockTimeout as exc:
            metrics.landing_lock_timeouts.labels("swap").inc()
            log.warning(
                "landing record's swap lock held by another process (frozen?); retried later",
                key=key,  # names the topic and partition
                timeout_s=self.cas_lock_timeout,
            )
            raise CommitLockTimeout(f"{key}: compare-and-swap: {exc}") from None

    def prepare(self, key: str) -> None:
        """Create ``key``'s folder now (the object store calls it when staging a file for
        ``key``): a folder that cannot be created fails the publication before its claim, so the
        publisher keeps its batch, rather than after it."""
        path = self._path(key)
        try:
            self._folder(path)
        except OSError as exc:
            raise self._error(exc, f"folder of {key}") from None

    def upload(self, key: str, path: Path) -> None:
        """Link (or, across filesystems, copy) the local file ``path`` to ``key``; ``path`` must
        not change afterwards (the object store's scratch file is deleted, never rewritten)."""
        dst = self._path(key)
        try:
            self._folder(dst)
            tmp = self._temp(dst)
            try:
                os.link(path, tmp)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(path, tmp)
            try:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, dst)
            finally:
                tmp.unlink(missing_ok=True)
            fsutil.fsync_dir(dst.parent)
        except OSError as exc:
            raise self._error(exc, f"upload {key}") from None

    def get(self, key: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._error(exc, f"get {key}") from None
        return data, _etag(data)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._error(exc, f"head {key}") from None
        return _info(key, st) if stat.S_ISREG(st.st_mode) else None  # a folder is no object

    def copy(self, src: str, dst: str) -> bool:
        s, d = self._path(src), self._path(dst)
        try:
            self._folder(d)
            tmp = self._temp(d)
            try:
                os.link(s, tmp)
            except FileNotFoundError:
                return False
            try:
                os.replace(tmp, d)
            finally:
                tmp.unlink(missing_ok=True)
            fsutil.fsync_dir(d.parent)
        except OSError as exc:
            raise self._error(exc, f"copy {src} -> {dst}") from None
        return True

    def list_objects(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / base if base else self.root
        found: list[tuple[str, os.stat_result]] = []
        try:
            for folder, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                rel = Path(folder).relative_to(self.root).as_posix()
                for name in files:
                    if name.startswith("."):
                        continue
                    key = name if rel == "." else f"{rel}/{name}"
                    if not key.startswith(prefix) or key <= start_after:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        found.append((key, os.stat(os.path.join(folder, name))))
        except OSError as exc:
            raise self._error(exc, f"list {prefix}") from None
        for key, st in sorted(found, key=lambda f: f[0]):
            yield _info(key, st)

    def list_dirs(self, prefix: str) -> list[str]:
        top = self.root / prefix if prefix else self.root
        try:
            with os.scandir(top) as it:
                return sorted(f"{prefix}{e.name}/" for e in it if e.is_dir() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._error(exc, f"list {prefix}") from None

    def delete(self, key: str) -> None:
        """Remove ``key`` and its swap lock file, if any. Removing a lock file is safe because a
        deleted key is never swapped again: the chain never re-creates a deleted key (probe and
        staged names are fresh, reap markers go with their staged object), so nobody can meet a
        new lock file for it while another holds the old one."""
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError):
            pass
        except OSError as exc:
            raise self._error(exc, f"delete {key}") from None
        with contextlib.suppress(OSError):
            self._lock(path).unlink(missing_ok=True)

    # -- chores -----------------------------------------------------------------------------------

    def remove_temp(self, older_than_s: float) -> int:
        """Delete temp files (and scratch files) that crashed writers left, older than
        ``older_than_s``; returns how many. Age only decides cost: a live writer's temp file is
        seconds old, and losing one makes its write fail (retried), never half-succeed. Lock
        files whose key is gone go too (see ``delete``)."""
        cutoff = time.time() - older_than_s
        removed = 0
        for folder, _dirs, files in os.walk(self.root):
            in_scratch = Path(folder).is_relative_to(self.scratch_dir)
            for name in files:
                orphan_lock = (
                    name.startswith(".")
                    and name.endswith(_LOCK_SUFFIX)
                    and not os.path.exists(os.path.join(folder, name[1 : -len(_LOCK_SUFFIX)]))
                )
                temp = name.startswith(".") and name.endswith(_TMP_SUFFIX)
                if not (in_scratch or temp or orphan_lock):
                    continue
                path = Path(folder) / name
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
        return removed


def _info(key: str, st: os.stat_result) -> ObjectInfo:
    weak = f'W/"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'
    return ObjectInfo(key, st.st_size, weak, st.st_mtime)
