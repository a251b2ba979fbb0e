"""The checks every file format shared by the launcher and the ranks applies to a field.

The cycle-info file (:mod:`.cycle_info`) and the straggler report file
(:mod:`.straggler_scores`) come from outside the process that reads them, so
each field's type and range is checked here, one way for both: a check returns the
value or raises ValueError naming the field (``where``), the value (cut to 80
characters) and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

__all__: list[str] = []

#: Largest integer field (a signed 32-bit int).
MAX_INT = 2**31 - 1
#: Longest span of seconds a field may hold (goodput, windows): ten years.
MAX_SPAN_S = 10 * 365 * 86400.0


def fail(where: str, value: object, why: str) -> NoReturn:
    """Raise the ValueError of field ``where`` holding ``value``: ``why``."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise ValueError(f"{where}={shown}: {why}")


def integer(where: str, value: object, low: int = 0, high: int = MAX_INT) -> int:
    """``value`` if it is an integer (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(where, value, "not an integer")
    if not low <= value <= high:
        fail(where, value, f"not in [{low}, {high}]")
    return value


def number(where: str, value: object, low: float, high: float) -> float:
    """``value`` as a float if it is a finite number (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(where, value, "not a number")
    try:
        result = float(value)
    except OverflowError:
        fail(where, value, "too large")
    if not math.isfinite(result) or not low <= result <= high:
        fail(where, value, f"not a finite number in [{low:g}, {high:g}]")
    return result


def text(where: str, value: object, limit: int, *, empty: bool = True) -> str:
    """``value`` if it is a string of at most ``limit`` characters (valid Unicode)."""
    if not isinstance(value, str):
        fail(where, value, "not a string")
    if len(value) > limit or (not empty and not value):
        fail(where, value, f"must be {'' if empty else '1-'}{limit} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        fail(where, value, "not valid Unicode (a lone surrogate)")
    return value


def sequence(where: str, value: object, limit: int) -> Sequence[Any]:
    """``value`` if it is a list (not a string) of at most ``limit`` items."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        fail(where, value, "not a list")
    if len(value) > limit:
        fail(where, f"<{len(value)} items>", f"more than {limit} items")
    return value


def check_schema_version(document: object, expected: int) -> None:
    """A document of another format version is refused before its fields are read."""
    if isinstance(document, Mapping) and "schema_version" in document:
        version = document["schema_version"]
        if type(version) is not int or version != expected:
            fail("schema_version", version, f"this nvrx reads version {expected} only")


def exact_object(where: str, value: object, keys: frozenset[str]) -> Mapping[str, Any]:
    """``value`` if it is an object with exactly ``keys``."""
    if not isinstance(value, Mapping):
        fail(where, value, "not an object")
    missing = sorted(keys - set(value))
    extra = sorted(str(k) for k in value if k not in keys)
    if missing or extra:
        fail(where, f"<object with keys {sorted(map(str, value))}>", keys_why(missing, extra))
    return value


def keys_why(missing: list[str], extra: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    return "; ".join(parts)
