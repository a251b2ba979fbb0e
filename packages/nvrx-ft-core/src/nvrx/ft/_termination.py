"""Terminate a hung or unhealthy rank, step by step, without blocking the monitor.

The sequence: SIGCONT (a stopped rank must run its handlers), the stack dump signal
(the rank's faulthandler writes every thread's stack to its log), a short pause for
the dump, the configured termination signal, then SIGKILL once the grace period ends.
The stack dump signal goes to the rank's own process only, so its DataLoader workers
and other children do not dump too (their stacks would bury the rank's). The other
signals go to the rank's process group when the rank leads its own group (ranks run
in their own session), else to the rank alone. The rank is tracked through a pidfd,
so a recycled pid is never signalled.
"""

from __future__ import annotations

import logging
import os
import select
import signal
from collections.abc import Callable

__all__ = ["STACK_DUMP_PAUSE_S", "RankProcess", "Terminator"]

#: Pause between the stack dump request and the termination signal.
STACK_DUMP_PAUSE_S = 0.3
_NS = 1_000_000_000


class RankProcess:
    """A rank process held through a pidfd: exit is observable, signals cannot misfire."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)

    def has_exited(self) -> bool:
        """True once the process has terminated (even if not yet reaped)."""
        if self.pidfd < 0:
            return True
        ready, _, _ = select.select([self.pidfd], [], [], 0)
        return bool(ready)

    def leads_group(self) -> bool:
        """True when the rank is its own process group leader."""
        try:
            return os.getpgid(self.pid) == self.pid
        except ProcessLookupError:
            return False

    def signal(self, sig: signal.Signals, *, group: bool) -> None:
        """Send ``sig`` to the rank (and its group if asked) while it has not exited."""
        if self.has_exited():
            return
        try:
            if group:
                os.killpg(self.pid, sig)
            else:
                signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def state(self) -> str | None:
        """The rank's scheduler state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``D``,
        ``T`` stopped by a signal, ``t`` by a tracer, ``Z``...); None once it has exited or
        when it cannot be read. Read before signalling it: SIGCONT changes ``T`` to ``R``.
        """
        if self.has_exited():
            return None
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as stream:
                raw = stream.read(4096)
        except OSError:
            return None
        # "pid (comm) S ...": comm may hold spaces and parentheses, so split at the last ")".
        _, sep, rest = raw.rpartition(b")")
        fields = rest.split()
        if not sep or not fields or len(fields[0]) != 1 or not fields[0].isalpha():
            return None
        if self.has_exited():  # the pid may have been reused while we read
            return None
        return fields[0].decode("ascii")

    def close(self) -> None:
        """Release the pidfd."""
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


class Terminator:
    """Drives one termination; call :meth:`advance` until it returns None."""

    def __init__(
        self,
        proc: RankProcess,
        *,
        term_signal: signal.Signals,
        grace_period_s: float,
        dump_signal: signal.Signals | None,
        logger: logging.Logger,
        after_dump: Callable[[], None] | None = None,
    ) -> None:
        self.proc = proc
        self._after_dump = after_dump
        self._term_signal = term_signal
        self._grace_ns = int(grace_period_s * _NS)
        self._dump_signal = dump_signal
        self._logger = logger
        self._group = proc.leads_group()
        self._step = 0
        self._due = 0

    @property
    def target(self) -> str:
        """Who gets the signals, for logs."""
        return f"process group {self.proc.pid}" if self._group else f"pid {self.proc.pid}"

    def _send(self, sig: signal.Signals, *, own_pid: bool = False) -> None:
        """Signal the target; ``own_pid``: the rank's own process only, never its group."""
        group = self._group and not own_pid
        target = f"pid {self.proc.pid}" if not group else self.target
        self._logger.info("sending %s to %s", sig.name, target)
        self.proc.signal(sig, group=group)

    def _dumped(self) -> None:
        """Run ``after_dump`` once: after the dump pause, before the termination signal."""
        callback, self._after_dump = self._after_dump, None
        if callback is not None:
            callback()

    def advance(self, now_ns: int) -> int | None:
        """Take the steps now due; return when to call again, or None when finished."""
        if self.proc.has_exited():
            self._dumped()
            if self._step:
                self._logger.info("rank pid %d has exited", self.proc.pid)
            return None
        if now_ns < self._due:
            return self._due
        if self._step == 0:
            self._send(signal.SIGCONT)
            self._step = 1
            if self._dump_signal is not None:
                self._send(self._dump_signal, own_pid=True)
                self._due = now_ns + int(STACK_DUMP_PAUSE_S * _NS)
                return self._due
        if self._step == 1:
            self._dumped()
            self._send(self._term_signal)
            self._step = 2
            if self._term_signal is not signal.SIGKILL:
                self._due = now_ns + self._grace_ns
                return self._due
        if self._step == 2:
            if self._term_signal is not signal.SIGKILL:
                self._logger.warning(
                    "rank pid %d survived %s for %.1f s; sending SIGKILL",
                    self.proc.pid,
                    self._term_signal.name,
                    self._grace_ns / _NS,
                )
                self._send(signal.SIGKILL)
            self._step = 3
        return now_ns + _NS // 20
