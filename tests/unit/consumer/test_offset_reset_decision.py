"""The on_offset_reset policy as a pure decision, table-driven over every policy and every
illegal-offset status."""

from __future__ import annotations

import pytest

from mqd.consumer.offset_reset import Action, Decision, decide
from mqd.consumer.source import ILLEGAL_OFFSET, FetchStatus


@pytest.mark.parametrize("status", sorted(ILLEGAL_OFFSET))
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("broker", Decision(Action.MOVE, to_offset=40)),
        ("earliest", Decision(Action.LOOKUP, spec="earliest")),
        ("latest", Decision(Action.LOOKUP, spec="latest")),
    ],
)
def test_policies(policy: str, expected: Decision, status: FetchStatus) -> None:
    """broker follows the node's next offset; earliest/latest look the offset up."""
    assert decide(policy, status, offset=500, next_offset=40, log_start=40, log_end=100) == expected


@pytest.mark.parametrize("status", sorted(ILLEGAL_OFFSET))
def test_fail_parks_with_status_offset_and_log_range(status: FetchStatus) -> None:
    """fail parks the partition; the reason names the status, the offset and the log range."""
    d = decide("fail", status, offset=500, next_offset=40, log_start=40, log_end=100)
    assert d.action is Action.PARK
    assert d.reason == f"{status.value} at offset 500 (log 40..100); on_offset_reset = fail"


def test_illegal_statuses_and_unknown_policy() -> None:
    """Exactly the three offset statuses are illegal; an unknown policy is a bug, not a default."""
    assert ILLEGAL_OFFSET == {
        FetchStatus.OFFSET_TOO_SMALL,
        FetchStatus.OFFSET_OVERFLOW_BADLY,
        FetchStatus.NO_MESSAGE,
    }
    with pytest.raises(ValueError, match="unknown on_offset_reset"):
        decide("nope", FetchStatus.OFFSET_TOO_SMALL, 0, 0, 0, 0)
