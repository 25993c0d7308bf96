"""The stage writer: one staged Parquet file written a row group at a time (store.py's
``open_stage``), so a landing file of ``landing.max_bytes`` never sits in memory whole.

Blocking code, used by one landing worker thread at a time. The records go to the Parquet writer
as they are cut from the sink's buffers (``write``: one row group per call); ``finish`` writes the
footer with the file's final range, makes the bytes durable where no reader looks and returns the
``StagedFile`` the claim chain commits; ``abort`` forgets it.

Where the bytes go is the target's business (store.py builds the two):

* a local directory: a scratch file under ``_staging/.scratch`` (same filesystem), fsynced and
  linked under ``_staging/`` by ``finish`` (``LocalObjects.upload``);
* object storage: an upload that sends parts of at least 5 MiB as they fill, or one PUT when the
  file stays small (``S3Objects.open_upload``).

The file's range (last offset, count, event times) is known only at ``finish``, but readers
(``layout.read_ranges``, the bench, Spark users) read it from the Arrow schema's metadata. Parquet
writes its key/value metadata with the footer, so ``finish`` adds the range there and replaces the
serialized Arrow schema (``ARROW:schema``, written by the writer at open) with one that carries the
range: the file reads exactly like one written whole by ``layout.write_parquet``.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from mqd.landing import layout
from mqd.landing.layout import FileRange
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mqd.landing import schema
else:  # off the daemon's start path (mqd/lazy_import.py)
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")
    schema = lazy_import("mqd.landing.schema")

_ARROW_SCHEMA = b"ARROW:schema"


@dataclass(frozen=True, slots=True)
class StagedFile:
    """A file written durably but not visible: what ``finish`` returns, the input of the store's
    ``commit``."""

    range: FileRange  # with its size and creation time
    location: str  # where the store keeps the staged bytes (local: the temp file's path)


class Upload(Protocol):
    """A streaming, unconditional write of one fresh object (a staged file)."""

    def write(self, data: bytes | memoryview) -> int:
        """Append bytes; returns how many (all of them)."""
        ...

    def complete(self) -> int:
        """Make the object durable under its key; returns its size."""
        ...

    def abort(self) -> None:
        """Forget whatever was sent; never raises."""
        ...


def range_metadata(rng: FileRange) -> dict[bytes, bytes]:
    """The file metadata of a landing file of ``rng`` (what ``layout.read_ranges`` reads)."""
    return {
        layout.META_VERSION: str(layout.SCHEMA_VERSION).encode(),
        layout.META_RANGES: json.dumps([rng.to_json()]).encode(),
    }


class ParquetStage:
    """One staged file being written (see the module docstring). ``where``: a local path or a
    writable file object; ``done()``: after the footer is written, make the bytes durable under
    ``key`` and return the size; ``drop()``: forget them (abort); ``wrote()``, if given: after each
    row group (a local file starts its writeback, ``fsutil.start_writeback``)."""

    def __init__(
        self,
        where: str | pa.NativeFile,
        key: str,
        compression: str,
        *,
        done: Callable[[], int],
        drop: Callable[[], None],
        wrote: Callable[[], None] | None = None,
    ) -> None:
        self.key = key
        self._done = done
        self._drop = drop
        self._wrote = wrote
        self._schema = schema.LANDING_SCHEMA.with_metadata(
            {layout.META_VERSION: str(layout.SCHEMA_VERSION).encode()}
        )
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            where, self._schema, **layout.parquet_options(compression)
        )
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            raise ValueError(f"{self.key}: staged file already finished or aborted")
        self._writer.write_table(table.replace_schema_metadata(self._schema.metadata))
        self.rows += table.num_rows
        if self._wrote is not None:
            self._wrote()

    def finish(self, rng: FileRange) -> StagedFile:
        writer, self._writer = self._writer, None
        if writer is None:
            raise ValueError(f"{self.key}: staged file already finished or aborted")
        if rng.count != self.rows:
            raise ValueError(f"{self.key}: range says {rng.count} records, {self.rows} were written")
        meta = range_metadata(rng)
        serialized = schema.LANDING_SCHEMA.with_metadata(meta).serialize().to_pybytes()
        writer.add_key_value_metadata({**meta, _ARROW_SCHEMA: base64.b64encode(serialized)})
        try:
            writer.close()
            size = self._done()
        except BaseException:
            self._drop()
            raise
        return StagedFile(replace(rng, bytes=size, created=layout.iso_now()), self.key)

    def abort(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()  # the footer of a file nobody will read: only to release the handle
        with contextlib.suppress(Exception):
            self._drop()
