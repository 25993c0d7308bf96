"""The one duration syntax and the one size syntax of every config key (issue 17).

Durations: a number and a unit, ``"500ms"``, ``"5s"``, ``"1.5s"``, ``"2m"``, ``"1h"``, ``"7d"``, or
several of them in a row, Go's way (``"1m30s"``). Sizes: ``"512KiB"``, ``"32MiB"``, ``"1GiB"``,
``"1TiB"`` (powers of 1024) and ``"64KB"``, ``"64MB"``, ``"1GB"``, ``"1TB"`` (powers of 1000: MB is
10^6 bytes, as in Kafka's and the SI's use), ``"100B"``; unit letters are case-insensitive. A bare
number keeps the unit its key always had (a ``*_ms`` key's number is milliseconds, a float-seconds
key's is seconds, a size key's is bytes), so every existing file keeps its meaning.

The config models use the Annotated types below (``Seconds``, ``Millis``, ``Bytes``); the parsing
is exact (fractions, not floats) so ``"1.1s"`` is 1100 ms, not 1100.0000000000002.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, FiniteFloat

DURATION_FORMS = "'500ms', '5s', '1.5s', '2m', '1h', '7d' (or combined: '1m30s')"
SIZE_FORMS = "'512KiB', '32MiB', '1GiB' (1024-based), '64KB', '64MB', '1GB' (1000-based), '100B'"

# seconds per unit
_DURATION_UNITS: dict[str, Fraction] = {
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
    "d": Fraction(86400),
}
# bytes per unit, keys lower-case
_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_DURATION_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)")
_DURATION = re.compile(rf"(?:{_NUMBER}\s*(?:ms|s|m|h|d)\s*)+")
_SIZE = re.compile(rf"({_NUMBER})\s*([a-z]+)", re.IGNORECASE)
_MAX_DIGITS = 30  # far past any sane value; keeps a pasted megabyte of digits cheap to refuse


def _duration_fraction(text: str) -> Fraction:
    t = text.strip()
    if len(t) > 200 or not _DURATION.fullmatch(t):
        if re.fullmatch(_NUMBER, t):
            raise ValueError(
                "no unit; write it as a bare number (no quotes) or with a unit: {DURATION_FORMS}"
            )
        raise ValueError(f"not a duration; use {DURATION_FORMS}")
    total = Fraction(0)
    for number, unit in _DURATION_PART.findall(t):
        if len(number) > _MAX_DIGITS:
            raise ValueError("out of range")
        total += Fraction(number) * _DURATION_UNITS[unit]
    return total


def parse_duration(text: str) -> float:
    """Seconds in ``text`` (``"1.5s"`` -> 1.5). Raises ValueError naming the accepted forms."""
    seconds = float(_duration_fraction(text))
    if not math.isfinite(seconds):
        raise ValueError("out of range")
    return seconds


def parse_duration_ms(text: str) -> int:
    """Whole milliseconds in ``text`` (``"2m"`` -> 120000); a fraction of a millisecond is refused."""
    ms = _duration_fraction(text) * 1000
    if ms.denominator != 1:
        raise ValueError("not a whole number of milliseconds")
    return int(ms)


def parse_size(text: str) -> int:
    """Bytes in ``text`` (``"32MiB"`` -> 33554432). Raises ValueError naming the accepted forms."""
    m = _SIZE.fullmatch(text.strip())
    if m is None or m.group(2).lower() not in _SIZE_UNITS:
        if re.fullmatch(_NUMBER, text.strip()):
            raise ValueError("no unit; write bytes as a bare number (no quotes) or with a unit: {SIZE_FORMS}")
        raise ValueError(f"not a size; use {SIZE_FORMS}")
    number, unit = m.groups()
    if len(number) > _MAX_DIGITS:
        raise ValueError("out of range")
    size = Fraction(number) * _SIZE_UNITS[unit.lower()]
    if size.denominator != 1:
        raise ValueError("not a whole number of bytes")
    return int(size)


def format_duration_ms(ms: int) -> str:
    """The shortest exact text for ``ms`` milliseconds in the duration syntax (``90000`` -> ``"90s"``,
    ``3600000`` -> ``"1h"``); parse_duration_ms reads it back to ``ms``."""
    if ms < 0:
        raise ValueError("a duration is not negative")
    for unit in ("d", "h", "m", "s"):
        per = int(_DURATION_UNITS[unit] * 1000)
        if ms and ms % per == 0:
            return f"{ms // per}{unit}"
    return f"{ms}ms"


def format_size(size: int) -> str:
    """The shortest exact text for ``size`` bytes, 1024-based units first (``33554432`` -> ``"32MiB"``)."""
    if size < 0:
        raise ValueError("a size is not negative")
    for unit in ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB"):
        per = _SIZE_UNITS[unit.lower()]
        if size and size % per == 0:
            return f"{size // per}{unit}"
    return f"{size}B"


def spark_interval(text: str) -> str | None:
    """``text`` in the duration syntax as Spark's interval text (``"1.5s"`` -> ``"1500 milliseconds"``),
    or None when it is not in that syntax (Spark's own ``"10 seconds"`` form is checked elsewhere)."""
    try:
        ms = _duration_fraction(text) * 1000
    except ValueError:
        return None
    if ms.denominator != 1:
        raise ValueError(f"{text!r}: Spark's trigger takes whole milliseconds")
    ms_int = int(ms)
    if ms_int % 1000 == 0:
        return f"{ms_int // 1000} seconds"
    return f"{ms_int} milliseconds"


def jvm_memory(text: str) -> str:
    """A JVM memory size (``"1g"``, ``"512m"``: Spark's driver_memory) from itself or the size syntax
    (``"2GiB"`` -> ``"2g"``). The JVM's k/m/g/t are 1024-based."""
    t = text.strip()
    if re.fullmatch(r"[0-9]+[kmgt]?", t, re.IGNORECASE):
        return t.lower()
    size = parse_size(t)
    for suffix, per in (("t", 1024**4), ("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if size and size % per == 0:
            return f"{size // per}{suffix}"
    return str(size)


# -- pydantic types: a bare number passes through unchanged (its key's unit); text is parsed ------


def seconds_validator(value: Any) -> Any:
    return parse_duration(value) if isinstance(value, str) else value


def millis_validator(value: Any) -> Any:
    return parse_duration_ms(value) if isinstance(value, str) else value


def bytes_validator(value: Any) -> Any:
    return parse_size(value) if isinstance(value, str) else value


# the type after the parser (a finite float, an int) checks the result, with the field's bounds
Seconds = Annotated[FiniteFloat, BeforeValidator(seconds_validator)]  # a float-seconds key
Millis = Annotated[int, BeforeValidator(millis_validator)]  # a ``*_ms`` key
Bytes = Annotated[int, BeforeValidator(bytes_validator)]  # a size key

__all__ = [
    "DURATION_FORMS",
    "SIZE_FORMS",
    "Bytes",
    "Millis",
    "Seconds",
    "bytes_validator",
    "format_duration_ms",
    "format_size",
    "jvm_memory",
    "millis_validator",
    "parse_duration",
    "parse_duration_ms",
    "parse_size",
    "seconds_validator",
    "spark_interval",
]
