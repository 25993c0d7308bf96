"""Exactly-once landing of drained batches as Parquet files (DESIGN.md §3)."""

from mqd.landing.layout import (
    LANDING_SCHEMA,
    FileRange,
    LandingCorrupt,
    LandingError,
)
from mqd.landing.markers import update_markers
from mqd.landing.publisher import PartitionState, PublishConflict, Publisher, read_manifest
from mqd.landing.sink import FlushResult, LandingSink

__all__ = [
    "LANDING_SCHEMA",
    "FileRange",
    "FlushResult",
    "LandingCorrupt",
    "LandingError",
    "LandingSink",
    "PartitionState",
    "PublishConflict",
    "Publisher",
    "read_manifest",
    "update_markers",
]
