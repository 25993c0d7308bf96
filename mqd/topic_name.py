"""The one rule for topic names, checked at every edge (config, broker, producer, landing, CLI).

Kafka's rule: 1 to 249 characters from ``[A-Za-z0-9._-]``, and not ``.`` or ``..``. A topic name
becomes a folder name in the broker's data dir (``<topic>-<partition>``) and in the landing
(``topic=<t>/``, ``_state/<t>/``, ``_manifest/<t>/``), so a name that could climb out of its folder
must never get that far; one function keeps every edge on the same rule.
"""

from __future__ import annotations

import re

from mqd.errors import MqdError

MAX_LENGTH = 249  # Kafka's limit: room for "-<partition>" and a suffix inside a 255-byte file name
_ALLOWED = re.compile(r"[A-Za-z0-9._-]+")


class InvalidTopicName(MqdError, ValueError):
    """A topic name outside the rule. Not retriable: the name has to change.

    A ValueError too, so pydantic validators report it as a config error for the key."""

    retriable = False


def topic_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid topic name, or None when it is."""
    if not isinstance(name, str):
        return f"a topic name is a string, got {type(name).__name__}"
    if not name:
        return "a topic name may not be empty"
    if len(name) > MAX_LENGTH:
        return f"a topic name has at most {MAX_LENGTH} characters, got {len(name)}"
    if name in (".", ".."):
        return f"{name!r} is not a topic name"
    if _ALLOWED.fullmatch(name) is None:
        return f"topic {name[:60]!r} may only use letters A-Z a-z, digits and . _ -"
    return None


def check_topic_name(name: str) -> str:
    """``name`` unchanged when valid (so it composes into paths), else InvalidTopicName."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidTopicName(problem)
    return name
