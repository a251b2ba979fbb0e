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

Between cycles, :func:`sweep` ends them earlier: what a rank started carries the
variables torch gives every rank (``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``)
in the environment it started with, so when a cycle's ranks have been stopped, and again
before the next cycle's start, :class:`RankLeftovers` kills each such child of the
launcher (and, as it goes, their children): a daemon a rank left cannot hold a GPU's
memory or a port into the next cycle. A health-check command's are marked and swept the
same way when the check ends. One that cleared its environment is only reached at the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ._events import CycleStarted, Event, WorkersStopped

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
#: The longest one sweep between cycles may take (a process in D state dies late: the
#: launcher's end takes what is left).
_SWEEP_BUDGET_S = 2.0
#: What torch puts in every rank's environment and what the rank starts inherits.
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"


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


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with; empty when unreadable (or a zombie)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            data = environ.read()
    except OSError:
        return {}
    found: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            found[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return found


def started_by_a_rank(run_id: str) -> Callable[[Mapping[str, str]], bool]:
    """Whether an environment is that of a rank of ``run_id`` or of what a rank started."""

    def matches(env: Mapping[str, str]) -> bool:
        return env.get(RUN_ID_ENV) == run_id and RESTART_COUNT_ENV in env

    return matches


def sweep(
    matches: Callable[[Mapping[str, str]], bool], budget_s: float = _SWEEP_BUDGET_S
) -> list[int]:
    """SIGKILL and reap this process's children whose environment ``matches``; their pids.

    Killing one hands its own children to this process (a subreaper), so it repeats
    until none is left or ``budget_s`` is spent. Zombies are left alone (their
    environment is gone, and a Popen may be waiting for them).
    """
    me = os.getpid()
    deadline = time.monotonic() + budget_s
    killed: list[int] = []
    while time.monotonic() < deadline:
        targets = {
            pid
            for pid, (state, _) in _children(me).items()
            if state != "Z" and pid not in killed and matches(_environ(pid))
        }
        if not targets:
            break
        for pid in sorted(targets):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.extend(sorted(targets))
        _reap(targets, deadline)
    return killed


class RankLeftovers:
    """Bus subscriber: what a cycle's ranks left running dies with the cycle.

    Runs when this node's ranks were stopped and before the next cycle's ranks start
    (nothing of the run's ranks may run then), so a daemon a rank started in a session
    of its own does not live into the next cycle.
    """

    def __init__(self, run_id: str) -> None:
        self._matches = started_by_a_rank(run_id)

    def __call__(self, event: Event, record: dict[str, Any]) -> None:
        if not isinstance(event, WorkersStopped | CycleStarted):
            return
        killed = sweep(self._matches)
        if killed:
            logger.warning(
                "killed %d process(es) the last cycle's ranks left running (outside "
                "their process groups): pids %s",
                len(killed),
                killed,
            )


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
                _reap(set(left), time.monotonic() + _REAP_WAIT_S)
        finally:
            with contextlib.suppress(OSError, AttributeError):
                _prctl(_PR_SET_CHILD_SUBREAPER, self._previous or 0)
            self.active = False
        if killed:
            logger.warning("killed %d process(es) the job left behind", len(killed))
        return killed


def _reap(pids: set[int], deadline: float) -> None:
    """Reap ``pids`` (killed children of this process) until they are gone or ``deadline``."""
    pids = set(pids)
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
