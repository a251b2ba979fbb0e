"""A monitor's liveness beat: proof that its loop makes progress, not only that it exists.

A stopped (SIGSTOP) or wedged monitor is still a live process, so checking the pid
misses it. Each monitor maps a small file next to its socket (``<socket>.beat``,
mode 0600, in the private runtime directory) and stores ``time.monotonic_ns()`` into
it on every turn of its loop, which turns at least every :data:`BEAT_PERIOD_S`.
:func:`beat_age` reads it from another process on the same host (the same clock).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import struct
import time

__all__ = ["BEAT_PERIOD_S", "BeatWriter", "beat_age", "beat_path", "monitor_beat_age"]

#: A running monitor's loop stores a beat at least this often (seconds).
BEAT_PERIOD_S = 0.25
_SLOT = struct.Struct("=q")


def beat_path(socket_path: str | os.PathLike[str]) -> pathlib.Path:
    """Where the monitor listening on ``socket_path`` keeps its beat."""
    return pathlib.Path(f"{os.fspath(socket_path)}.beat")


class BeatWriter:
    """The monitor's side: one mapped 8-byte slot, one plain store per beat."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            os.ftruncate(fd, mmap.PAGESIZE)
            self._map = mmap.mmap(fd, mmap.PAGESIZE)
        finally:
            os.close(fd)
        self._slot = memoryview(self._map).cast("q")
        self.beat(time.monotonic_ns())

    def beat(self, now_ns: int) -> None:
        """Record that the loop is turning."""
        self._slot[0] = now_ns

    def close(self, *, remove: bool) -> None:
        """Unmap (and remove the file when the monitor stops cleanly)."""
        self._slot.release()
        self._map.close()
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def beat_age(socket_path: str | os.PathLike[str]) -> float | None:
    """Seconds since the monitor on ``socket_path`` last beat; None if it has no beat file.

    A running monitor's age stays below about :data:`BEAT_PERIOD_S` (plus scheduling
    delay on a loaded machine); a stopped one's grows without bound. Never blocks.
    """
    try:
        fd = os.open(
            beat_path(socket_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return None
    try:
        data = os.pread(fd, _SLOT.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != _SLOT.size:
        return None
    last_ns = int(_SLOT.unpack(data)[0])
    if last_ns <= 0:
        return None
    return max(0.0, (time.monotonic_ns() - last_ns) / 1e9)


#: :func:`beat_age` under its public name, ``nvrx.ft.monitor_beat_age``.
monitor_beat_age = beat_age
