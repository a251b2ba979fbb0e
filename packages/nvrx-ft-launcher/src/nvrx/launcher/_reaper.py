"""No process of the job outlives the launcher, even one that left its process group.

A rank (or a health-check command) that starts a process in a new session (``setsid``,
a daemonising tool) takes it out of the rank's process group, so neither the guard that
kills the group nor torch's stop reaches it; normally it is re-parented to init and
outlives the job. The launcher therefore makes itself a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4+): such an orphan is re-parented to the
launcher instead (and, when one ends while the job runs, is reaped by it: a rank's guard
ends every cycle). When the launcher ends (after its ranks, monitors and spares are
stopped), :meth:`Reaper.close` SIGKILLs every child it still has, that is every process
the job left behind, and reaps it; killing a child re-parents its own children to the
launcher, so it repeats until none is left. Only the launcher's own children are
signalled, and a child's pid cannot be reused before the launcher reaps it, so no
unrelated process is ever hit.

Children the process had before the launcher started (an in-process caller's) are left
alone, and the caller's subreaper setting is restored. Where prctl is not available,
nothing changes: such a process outlives the launcher (under SLURM or Kubernetes the
job's cgroup ends it). A launcher killed with SIGKILL cannot clean up either; its
orphans then go to the next subreaper or init.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
#: Rounds of kill-and-reap (each round reaches one more generation of the tree).
_MAX_ROUNDS = 64
#: How long one round waits for the killed children to be reapable.
_REAP_WAIT_S = 2.0
_POLL_S = 0.01
#: How often orphans that ended while the job runs are reaped (one /proc scan each).
_ORPHAN_REAP_S = 10.0
_JOIN_S = 1.0


def _prctl(option: int, arg: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = int(libc.prctl(option, arg, 0, 0, 0))
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _children(pid: int) -> dict[int, tuple[str, int]]:
    """``pid``'s children: their state letter (``Z``: a zombie) and process group."""
    found: dict[int, tuple[str, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read().decode("ascii", "replace")
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[1].isdigit() and int(fields[1]) == pid:
            found[int(entry)] = (fields[0], int(fields[2]) if fields[2].isdigit() else -1)
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read(200).replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"


class Reaper:
    """The launcher as subreaper for the job's processes; :meth:`close` at its end."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._before = set(_children(self._pid))
        self._previous: int | None = None
        self.active = False
        try:
            was = ctypes.c_int(0)
            _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was))
            _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        except (OSError, AttributeError) as exc:
            logger.debug(
                "cannot become a child subreaper (%s): processes that leave "
                "their process group may outlive the launcher",
                exc,
            )
            return
        self._previous = was.value
        self.active = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._reap_loop, name="nvrx-reaper", daemon=True)
        self._thread.start()

    def _reap_loop(self) -> None:
        """Reap, while the job runs, orphans that ended: never a child someone waits for.

        Only a zombie whose process group is another process's (not its own, not the
        launcher's) is taken: it was started inside a rank's group (a rank's guard, a
        helper) and re-parented here, so no Popen of the launcher waits for it; reaping
        one that does would turn its exit status into 0.
        """
        own_group = os.getpgrp()
        while not self._stop.wait(_ORPHAN_REAP_S):
            for pid, (state, group) in _children(self._pid).items():
                if state == "Z" and group not in (pid, own_group) and pid not in self._before:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)

    def close(self) -> list[int]:
        """SIGKILL and reap every child left (not one from before); their pids."""
        if not self.active:
            return []
        killed: list[int] = []
        self._stop.set()
        self._thread.join(_JOIN_S)
        try:
            for _ in range(_MAX_ROUNDS):
                left = {p: s for p, s in _children(self._pid).items() if p not in self._before}
                if not left:
                    break
                for pid, (state, _) in left.items():
                    if state != "Z":
                        if not killed:
                            logger.warning(
                                "killing processes the job left behind (started outside "
                                "the ranks' process groups), e.g. pid %d: %s",
                                pid,
                                _name(pid),
                            )
                        killed.append(pid)
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGKILL)
                self._reap(set(left))
        finally:
            with contextlib.suppress(OSError, AttributeError):
                _prctl(_PR_SET_CHILD_SUBREAPER, self._previous or 0)
            self.active = False
        if killed:
            logger.warning("killed %d process(es) the job left behind", len(killed))
        return killed

    @staticmethod
    def _reap(pids: set[int]) -> None:
        deadline = time.monotonic() + _REAP_WAIT_S
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere (its Popen)
                    done = pid
                if done == pid:
                    pids.discard(pid)
            if pids:
                time.sleep(_POLL_S)
