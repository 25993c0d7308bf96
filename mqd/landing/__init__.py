"""Exactly-once landing of drained batches as Parquet files (DESIGN.md §3).

Code map: ``sink`` (publication scheduling, the daemon's interface), ``micro_batches`` (buffers
and when to cut them), ``publisher`` (records -> files through a store), ``store`` (the storage
seam: ``LandingStore``, the one store), ``local_store`` (that store on a local directory),
``backends`` (``open_store``: the store ``landing.dir`` names), ``errors`` (the landing's errors),
``layout`` (names and Parquet encoding), ``schema`` (the landing schema, once), ``markers``
(completeness markers).
"""

from typing import Any

from mqd.landing.backends import open_store
from mqd.landing.errors import LandingCorrupt, LandingError, PublishConflict
from mqd.landing.layout import FileRange
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher
from mqd.landing.sink import LandingSink, PublishResult, PublishStats
from mqd.landing.stage_writer import StagedFile
from mqd.landing.store import LandingStore, PartitionHead

__all__ = [
    "FileRange",
    "LandingCorrupt",
    "LandingError",
    "LandingSink",
    "LandingStore",
    "LocalStore",
    "PartitionHead",
    "PublishConflict",
    "PublishResult",
    "PublishStats",
    "Publisher",
    "StagedFile",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # mqd.landing.schema's constant builds a pyarrow schema: imported on first use, so that the
    # daemon reads start positions (claim chains, JSON) before it imports pyarrow (issue 16)
    if name == "LANDING_SCHEMA":
        from mqd.landing.schema import LANDING_SCHEMA

        return LANDING_SCHEMA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
