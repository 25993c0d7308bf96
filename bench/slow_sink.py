"""``mqd run`` with a landing sink slowed to a fixed byte rate (the benchmark's memory scenario).

Publishing a file first sleeps for its Arrow size divided by ``MQD_BENCH_SINK_BYTES_PER_S``, on the
publisher's worker thread, so the sink is slower than the fetch and the backlog presses against the
daemon's buffer budget. Everything else is the real daemon.

    MQD_BENCH_SINK_BYTES_PER_S=5000000 python bench/slow_sink.py run --config X --burst
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from mqd.landing import publisher


def main() -> None:
    rate = float(os.environ.get("MQD_BENCH_SINK_BYTES_PER_S", "0"))
    if rate <= 0:
        sys.exit("MQD_BENCH_SINK_BYTES_PER_S must be a positive number")
    original = publisher.Publisher.publish

    def slow_publish(
        self: publisher.Publisher, topic: str, partition: int, records: Any, *a: Any, **kw: Any
    ) -> Any:
        time.sleep(records.nbytes / rate)
        return original(self, topic, partition, records, *a, **kw)

    publisher.Publisher.publish = slow_publish  # type: ignore[method-assign]
    from mqd.operator.cli import main as cli

    cli(sys.argv[1:], prog_name="mqd")


if __name__ == "__main__":
    main()
