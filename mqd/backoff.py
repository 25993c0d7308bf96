"""The one backoff: capped exponential with jitter, for every retry loop in mqd.

Jitter (+-20 % by default) keeps many clients that failed together from retrying together.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    failures: int,
    *,
    base: float,
    cap: float,
    jitter: float = 0.2,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """Seconds to wait after ``failures`` (>= 1) errors in a row: base, 2*base, 4*base, ... up to
    ``cap``, then scaled by a random factor in [1 - jitter, 1 + jitter]."""
    delay: float = min(cap, base * 2.0 ** min(max(failures, 1) - 1, 30))
    return delay * float(uniform(1.0 - jitter, 1.0 + jitter)) if jitter else delay


class Backoff:
    """``backoff_delay`` with its failure count: ``next()`` after an error, ``reset()`` after a success."""

    def __init__(self, base: float, cap: float, *, jitter: float = 0.2) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return backoff_delay(self.failures, base=self.base, cap=self.cap, jitter=self.jitter)

    def reset(self) -> None:
        self.failures = 0
