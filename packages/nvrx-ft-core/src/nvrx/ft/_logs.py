"""One log line format for the launcher, the rank monitors and the Lightning callbacks.

Their lines end up interleaved in one job log; the same shape (who, when, level, what)
lets a reader or a log parser tell them apart without knowing which process wrote what.
"""

from __future__ import annotations

import logging

__all__ = ["LOG_DATE_FORMAT", "log_formatter"]

#: Wall-clock time of day; the milliseconds are added by the line format.
LOG_DATE_FORMAT = "%H:%M:%S"


def log_formatter(who: str) -> logging.Formatter:
    """``[who] HH:MM:SS.mmm LEVEL: message``; ``who`` may hold ``%(...)s`` record fields."""
    return logging.Formatter(
        f"[{who}] %(asctime)s.%(msecs)03d %(levelname)s: %(message)s", datefmt=LOG_DATE_FORMAT
    )
