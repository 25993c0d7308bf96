"""mqd's download cache: Spark packages and Apache Kafka's jars from Maven Central live here, so
they are fetched once per machine, not once per run.

``$MQD_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/mqd``, else ``~/.cache/mqd`` (the XDG base
directory rule that pip and Ivy users know).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache's root (not created here: whoever writes into it creates what it needs)."""
    explicit = os.environ.get("MQD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "mqd"


__all__ = ["cache_dir"]
