"""The landing's backends: which object primitives a ``landing.dir`` names, and the store over them.

A path is a POSIX directory (``LocalStore``: the store over local_objects.py); an ``s3://bucket/
prefix`` URI is S3-compatible storage (s3_objects.py; ``endpoint_url``/``region`` select an
S3-compatible store). Either way the caller gets the one ``LandingStore`` (store.py).
"""

from __future__ import annotations

from pathlib import Path

from mqd.landing.store import LandingStore
from mqd.landing.watermark import DEFAULT_MAX_EVENT_AHEAD_MS


def open_store(
    location: Path | str,
    *,
    max_event_ahead_ms: int | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
) -> LandingStore:
    """The store for ``landing.dir`` (``location``): a local directory or an ``s3://`` URI.
    ``max_event_ahead_ms``: the watermark's bound (landing.max_event_ahead, watermark.py; None:
    its default). Nothing is read or written before the caller's ``open()``."""
    ahead_ms = DEFAULT_MAX_EVENT_AHEAD_MS if max_event_ahead_ms is None else max_event_ahead_ms
    if isinstance(location, str) and location.startswith("s3://"):
        from mqd.landing.s3_objects import S3Objects  # boto3: only for an s3:// landing

        objects = S3Objects(location, endpoint_url=endpoint_url, region=region)
        return LandingStore(objects, max_event_ahead_ms=ahead_ms)
    from mqd.landing.local_store import LocalStore

    return LocalStore(Path(location), max_event_ahead_ms=ahead_ms)
