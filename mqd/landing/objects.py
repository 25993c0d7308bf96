"""The object primitives the claim-chain protocol is written against (claim_chain.py).

Seven operations that every S3-compatible store has, with the two conditions the protocol relies
on: ``put`` create-only (``If-None-Match: *``) and ``put`` if-match (``If-Match: <etag>``), both on
single-part objects. Keys are '/'-separated and relative to the landing root. The S3 backend is
s3_objects.py; the local-directory backend is local_objects.py (link for create-only, a bounded
swap lock for if-match), so that one protocol and one argument serve both stores.

Errors: ``PreconditionFailed`` is a definite answer (the condition did not hold, nothing was
written). ``ObjectStoreError`` is everything else: the request may or may not have taken effect
(a lost response), so callers that need to know read the object back.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str  # relative to the landing root
    size: int
    etag: str
    modified: float  # seconds since the epoch, by the store's clock (only ages use it)


class Objects(Protocol):
    """Blocking object primitives under one root (see the module docstring)."""

    @property
    def location(self) -> str:
        """The root, for logs (``s3://bucket/prefix``)."""
        ...

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        """Write a single-part object; returns its etag. ``if_absent``: only if ``key`` does not
        exist; ``if_match``: only if its etag is this one. PreconditionFailed otherwise."""
        ...

    def upload(self, key: str, path: Path) -> None:
        """Write a local file to ``key`` without a condition (multipart when large)."""
        ...

    def get(self, key: str) -> tuple[bytes, str] | None:
        """(body, etag), or None when ``key`` does not exist."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """The object's metadata, or None when it does not exist."""
        ...

    def copy(self, src: str, dst: str) -> bool:
        """Server-side copy; False when ``src`` does not exist (nothing written)."""
        ...

    def list_objects(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order, after ``start_after``."""
        ...

    def list_dirs(self, prefix: str) -> list[str]:
        """The next '/'-level under ``prefix`` (which ends with '/'): the sub-prefixes, each
        ending with '/'."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; no error when it does not exist."""
        ...
