"""Reading the training's progress marker (e.g. the last saved iteration) from a file.

The file must be a regular file: a FIFO or a device opened for reading could block the
launcher (before any rank started, or in the middle of a restart). It is refused when the
launcher starts, and every read opens it non-blocking and reads only a regular file.
"""

from __future__ import annotations

import os
import stat

__all__ = ["check_progress_file", "made_progress", "read_progress"]

_MAX_BYTES = 4096


def check_progress_file(path: str | os.PathLike[str]) -> None:
    """Raise ValueError when ``path`` exists and is not a regular file.

    A missing file is fine: the training creates it when it first makes progress.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ValueError(f"cannot stat it: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ValueError("not a regular file (a FIFO, device or directory would block or fail)")


def read_progress(path: str | os.PathLike[str] | None) -> int | None:
    """The integer in ``path`` (first token), or None when there is no usable value.

    The training writes it, e.g. the iteration of its last checkpoint. A missing,
    empty, garbled or non-regular file means "no progress known", never an error and
    never a wait: the file is written by user code that may crash half way.
    """
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, _MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
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
