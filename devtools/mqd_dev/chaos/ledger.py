"""The producer's ledger: every record the chaos load got an acknowledgement for, written as it goes.

The end check counts acknowledged records from this file, not from the broker log: a broker that
loses or rewrites its log (a lost data dir, a recovery that cuts a segment, a recreated topic) must
not change what "acknowledged" means. One line per record, tab-separated:
``topic, partition, offset, payload id, generation``. The payload id is the record's value
(``load.record_value``), unique in the run, so the check is independent of offsets, which a new
log incarnation may reuse. ``generation`` counts the times the chaos run itself deleted the
partition's log (``topic_recreate``): acknowledgements of an older generation are no longer
expected in the broker log, but still in the landing and the table. Generation -1 marks records
acknowledged before the daemons' first start with ``consume_from = "last"`` (the
``kill_before_publish`` set-up): in the log, and not expected in the landing. Offset -1 marks a
record a Kafka producer saw acknowledged without an offset (kafka_source.py): expected at any offset
of its partition.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("payload", pa.binary()),
        ("generation", pa.int32()),
    ]
)


class Ledger:
    """Append-only; ``record`` is called on the event loop for every acknowledged batch (a buffered
    write, flushed at ``flush``/``close``: the chaos process outlives every fault it injects)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        self._fh: IO[str] | None = None

    def start(self) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="ascii")  # held until close()

    def record(
        self, topic: str, partition: int, base_offset: int, payloads: list[bytes], generation: int
    ) -> None:
        if self._fh is None:
            raise RuntimeError("ledger not started")
        self._fh.write(
            "".join(
                f"{topic}\t{partition}\t{base_offset + i}\t{p.decode('ascii')}\t{generation}\n"
                for i, p in enumerate(payloads)
            )
        )
        self.records += len(payloads)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_ledger(path: Path) -> pa.Table:
    """The ledger file as a table (:data:`SCHEMA`); a torn last line (no newline) is ignored."""
    cols: dict[str, list[object]] = {name: [] for name in SCHEMA.names}
    if path.exists():
        for line in path.read_text(encoding="ascii").split("\n")[:-1]:
            topic, partition, offset, payload, generation = line.split("\t")
            cols["topic"].append(topic)
            cols["partition"].append(int(partition))
            cols["offset"].append(int(offset))
            cols["payload"].append(payload.encode("ascii"))
            cols["generation"].append(int(generation))
    return pa.table(cols, schema=SCHEMA)
