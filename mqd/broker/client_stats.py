"""Per-client request counters of a broker node, served by GET /v1/stats.

Tests and the benchmark read them (how many fetches a client sent, how many it holds at once).
Per-client entries are bounded: a client with nothing in flight and silent for ``idle_s`` is
dropped by :meth:`ClientStats.prune`, since client ids may be per process and would pile up.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

CLIENT_STATS_IDLE_S = 600.0  # per-client counters of a client silent this long are dropped


class ClientStats:
    """Request counts per route and per client, fetches in flight per client and their maximum."""

    def __init__(self, idle_s: float = CLIENT_STATS_IDLE_S) -> None:
        self.idle_s = idle_s
        self.requests: dict[str, int] = defaultdict(int)
        self.clients: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.last_seen: dict[str, float] = {}
        self.fetch_partitions = 0
        self.inflight: dict[str, int] = defaultdict(int)
        self.inflight_max: dict[str, int] = defaultdict(int)

    def count(self, client_id: str, what: str, now: float | None = None) -> None:
        self.clients[client_id][what] += 1
        self.last_seen[client_id] = time.monotonic() if now is None else now

    def fetch_started(self, client_id: str) -> None:
        self.inflight[client_id] += 1
        self.inflight_max[client_id] = max(self.inflight_max[client_id], self.inflight[client_id])

    def fetch_done(self, client_id: str) -> None:
        left = self.inflight[client_id] - 1
        if left > 0:
            self.inflight[client_id] = left
        else:
            del self.inflight[client_id]

    def prune(self, now: float | None = None) -> int:
        """Drop the counters of clients idle for ``idle_s`` with nothing in flight; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [
            c for c, seen in self.last_seen.items() if now - seen > self.idle_s and c not in self.inflight
        ]
        for c in idle:
            del self.last_seen[c]
            self.clients.pop(c, None)
            self.inflight_max.pop(c, None)
        return len(idle)

    def as_json(self, node_id: str) -> dict[str, Any]:
        return {
            "node": node_id,
            "requests": dict(self.requests),
            "clients": {c: dict(v) for c, v in self.clients.items()},
            "fetch_partitions": self.fetch_partitions,
            "inflight_fetch": {c: n for c, n in self.inflight.items() if n},
            "inflight_fetch_max_per_client": dict(self.inflight_max),
        }
