"""What wakes the agent's run loop before its tick: a child's exit or a watched descriptor.

A rank's exit (SIGCHLD) wakes the loop at once through the signal wakeup fd, so a crash
is seen in milliseconds, not at the next ``--monitor-interval`` tick; a monitor's event
or another node's decision (the coordinator's watcher) wake it through their
descriptors. :class:`Wakeup` owns the wakeup fd and the SIGCHLD handler while open.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__: list[str] = []


def _on_sigchld(signum: int, frame: object) -> None:
    """Nothing to do here: the wakeup fd already woke the run loop."""


class Wakeup:
    """The loop's wait: up to a timeout, or until a child exits or a descriptor is readable.

    ``watched`` gives the descriptors to select on, read at each wait (one may come
    and go: the decision watcher exists only after the first rendezvous).
    """

    def __init__(self, watched: Callable[[], list[Any]]) -> None:
        self._watched = watched
        self._wake: socket.socket | None = None
        self._undo: contextlib.ExitStack | None = None

    def __enter__(self) -> Wakeup:
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        undo = contextlib.ExitStack()
        undo.callback(wake_w.close)
        undo.callback(wake_r.close)
        previous_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        undo.callback(signal.set_wakeup_fd, previous_fd)
        previous_handler = signal.signal(signal.SIGCHLD, _on_sigchld)
        undo.callback(signal.signal, signal.SIGCHLD, previous_handler)
        self._wake, self._undo = wake_r, undo
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        undo, self._undo, self._wake = self._undo, None, None
        if undo is not None:
            undo.close()  # handler, then wakeup fd, then the sockets (reverse order)

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout``, waking early when a watched descriptor or a child is ready."""
        watched = [w for w in self._watched() if w is not None]
        if self._wake is not None:
            watched.append(self._wake)
        ready, _, _ = select.select(watched, [], [], timeout)
        if self._wake is not None and self._wake in ready:
            with contextlib.suppress(BlockingIOError):
                while self._wake.recv(4096):
                    pass
