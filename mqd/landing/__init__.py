"""Exactly-once landing of drained batches as Parquet files (DESIGN.md §3).

Code map: ``sink`` (publication scheduling, the daemon's interface), ``micro_batches`` (buffers
and when to cut them), ``publisher`` (records -> files through a store), ``store`` (the storage
seam: the publication contract), ``local_store`` (its local-directory implementation),
``layout`` (names and Parquet encoding), ``schema`` (the landing schema, once), ``markers``
(completeness markers).
"""

from typing import Any

from mqd.landing.errors import LandingCorrupt, LandingError, PublishConflict
from mqd.landing.layout import FileRange
from mqd.landing.local_store import LocalStore, PartitionState, read_manifest
from mqd.landing.markers import update_markers
from mqd.landing.publisher import Publisher
from mqd.landing.sink import LandingSink, PublishResult, PublishStats
from mqd.landing.store import LandingStore, PartitionHead, StagedFile, open_store

__all__ = [
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


def __getattr__(name: str) -> Any:
    # mqd.landing.schema's constant builds a pyarrow schema: imported on first use, so that the
    # daemon reads start positions (claim chains, JSON) before it imports pyarrow (issue 16)
    if name == "LANDING_SCHEMA":
        from mqd.landing.schema import LANDING_SCHEMA

        return LANDING_SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
