"""argparse value types shared by the launcher's option groups."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["number"]


def number(
    kind: Callable[[str], Any],
    *,
    minimum: float,
    maximum: float,
    what: str,
    above_minimum: bool = False,
) -> Callable[[str], Any]:
    """An argparse type: a finite number within bounds, else a usage error naming the value."""

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {what}") from None
        low_ok = value > minimum if above_minimum else value >= minimum
        if not (math.isfinite(value) and low_ok and value <= maximum):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {what}")
        return value

    convert.__name__ = what
    return convert
