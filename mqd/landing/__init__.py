"""Exactly-once landing of drained batches as Parquet files (DESIGN.md §3).

Code map: ``sink`` (publication scheduling, the daemon's interface), ``micro_batches`` (buffers
and when to cut them), ``publisher`` (records -> files through a store), ``store`` (the storage
seam: the publication contract), ``local_store`` (its local-directory implementation),
``layout`` (names and Parquet encoding), ``schema`` (the landing schema, once), ``markers``
(completeness markers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqd.landing.layout import FileRange, LandingCorrupt, LandingError
    from mqd.landing.local_store import LocalStore, PartitionState, read_manifest
    from mqd.landing.markers import update_markers
    from mqd.landing.publisher import Publisher
    from mqd.landing.schema import LANDING_SCHEMA
    from mqd.landing.sink import LandingSink, PublishResult, PublishStats
    from mqd.landing.store import LandingStore, PartitionHead, PublishConflict, StagedFile, open_store

# The names are imported on first use (PEP 562): importing one submodule (layout, for a reader of
# the files) must not load the sink, the config and the store with it (start-up time, issue 16).
_HOME = {
    "FileRange": "layout",
    "LandingCorrupt": "layout",
    "LandingError": "layout",
    "LocalStore": "local_store",
    "PartitionState": "local_store",
    "read_manifest": "local_store",
    "update_markers": "markers",
    "Publisher": "publisher",
    "LANDING_SCHEMA": "schema",
    "LandingSink": "sink",
    "PublishResult": "sink",
    "PublishStats": "sink",
    "LandingStore": "store",
    "PartitionHead": "store",
    "PublishConflict": "store",
    "StagedFile": "store",
    "open_store": "store",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "LANDING_SCHEMA",
    "FileRange",
    "LandingCorrupt",
    "LandingError",
    "LandingSink",
    "LandingStore",
    "LocalStore",
    "PartitionHead",
    "PartitionState",
    "PublishConflict",
    "PublishResult",
    "PublishStats",
    "Publisher",
    "StagedFile",
    "open_store",
    "read_manifest",
    "update_markers",
]
