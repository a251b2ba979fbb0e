"""Reading the training's progress marker (e.g. the last saved iteration) from a file."""

from __future__ import annotations

import os

__all__ = ["made_progress", "read_progress"]

_MAX_BYTES = 4096


def read_progress(path: str | os.PathLike[str] | None) -> int | None:
    """The integer in ``path`` (first token), or None when there is no usable value.

    The training writes it, e.g. the iteration of its last checkpoint. A missing,
    empty or garbled file means "no progress known", never an error: the file is
    written by user code that may crash half way.
    """
    if path is None:
        return None
    try:
        with open(path, "rb") as stream:
            text = stream.read(_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    tokens = text.split()
    if not tokens:
        return None
    try:
        return int(tokens[0])
    except ValueError:
        return None


def made_progress(before: int | None, after: int | None, min_iterations: int) -> bool:
    """True when the marker moved forward by at least ``min_iterations`` during a cycle."""
    if after is None:
        return False
    if before is None:
        return True
    return after - before >= min_iterations
