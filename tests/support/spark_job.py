"""The Spark job running in a thread of the test (``job.run(cfg, once=False)`` on the shared session),
and stopping it the way an operator's signal does: stop its queries until run() returns."""

from __future__ import annotations

import threading
import time
from typing import Any

from mqd.config import MqdConfig
from mqd.spark import job


def start_streaming(cfg: MqdConfig) -> tuple[threading.Thread, dict[str, int]]:
    """The job streaming in a started thread, and where its exit code will be (``"code"``)."""
    result: dict[str, int] = {}
    worker = threading.Thread(target=lambda: result.setdefault("code", job.run(cfg, once=False)))
    worker.start()
    return worker, result


def stop_streaming(spark: Any, worker: threading.Thread, timeout: float) -> None:
    """Stop every active query until the job's thread ends, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while worker.is_alive() and time.monotonic() < deadline:
        for q in spark.streams.active:
            q.stop()
        worker.join(0.5)
