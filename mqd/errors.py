"""The one root of mqd's errors (aiokafka's pattern: flags on the error carry the policy).

Every error mqd raises on purpose derives from :class:`MqdError`. ``retriable`` says whether the
same call may succeed later (a node down, a full disk) or needs a change first (bad config, bad
data); callers decide on the flag, never on the class name.
"""

from __future__ import annotations


class MqdError(Exception):
    """Base of mqd's errors. ``retriable``: trying again later may succeed."""

    retriable: bool = False

    def __init__(self, message: str = "", *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable
