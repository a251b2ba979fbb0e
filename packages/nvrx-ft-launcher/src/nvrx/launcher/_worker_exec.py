"""Exec shim run between the launcher and each rank: ties the rank's life to the launcher.

Run as ``python -I -S _worker_exec.py LAUNCHER_PID MONITOR_SOCKET CMD [ARGS...]``. It asks
the kernel to SIGKILL this process when the launcher dies (PR_SET_PDEATHSIG survives
exec), checks the launcher did not die before that, puts the monitor socket in the
environment and execs the real command. Standard library only, so it costs one bare
interpreter start (about 20 ms); ``subprocess.Popen`` gives no other hook to run code
in the child before exec.

The death signal reaches the rank only, not what the rank started (DataLoader workers,
compilers, a shell's children): those would outlive a SIGKILLed launcher. Torch starts
each rank in a session and process group of its own, which its stop kills as a whole;
the shim leaves a *guard* behind for the case where nobody is left to do that. The guard
is a forked copy of the shim, detached (its parent exits at once, so the rank never sees
an extra child), that stays in the rank's process group with every descriptor closed
and waits on two pidfds: the launcher's and the rank's. When the launcher dies first,
it SIGKILLs the rank's process group, itself included; when the rank ends first, it
just exits. It ignores the stop signals torch sends the group, so it cannot turn a
graceful stop into a kill. Processes that leave the rank's group (``setsid``) are out
of its reach; a scheduler's cgroup is the tool for those.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time
from collections.abc import Sequence

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1
#: Where a rank finds its monitor: ``nvrx.ft.MONITOR_SOCKET_ENV`` (this script runs with
#: ``-I -S`` and imports nothing outside the standard library; a test checks they agree).
MONITOR_SOCKET_ENV = "NVRX_FT_MONITOR_SOCKET"
# Only without pidfds (Linux before 5.3): how often the guard looks at the two pids.
_GUARD_POLL_S = 0.5
_IGNORED_BY_GUARD = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _others_in_group(pgid: int) -> bool:
    """True when a process other than this one is in process group ``pgid``."""
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return False
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stream:
                fields = stream.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command: state, ppid, pgrp; a zombie needs no killing.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _close_all_but(keep: list[int]) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _guard(launcher_pid: int, launcher_fd: int | None, rank_pid: int, rank_fd: int | None) -> None:
    """The guard's whole life: see the module docstring."""
    for sig in _IGNORED_BY_GUARD:
        signal.signal(sig, signal.SIG_IGN)
    _close_all_but([fd for fd in (launcher_fd, rank_fd) if fd is not None])
    pgid = os.getpgrp()
    launcher_gone = False
    if launcher_fd is not None and rank_fd is not None:
        ready, _, _ = select.select([launcher_fd, rank_fd], [], [])
        launcher_gone = launcher_fd in ready and rank_fd not in ready
    else:
        while _alive(rank_pid) and not launcher_gone:
            launcher_gone = not _alive(launcher_pid)
            time.sleep(_GUARD_POLL_S)
    # The rank ended first: what it left in its group is torch's to stop while the
    # launcher lives, and ours to kill if the launcher dies before that.
    while not launcher_gone and _others_in_group(pgid):
        if launcher_fd is not None:
            launcher_gone = bool(select.select([launcher_fd], [], [], _GUARD_POLL_S)[0])
        else:
            time.sleep(_GUARD_POLL_S)
            launcher_gone = not _alive(launcher_pid)
    if launcher_gone:
        os.killpg(pgid, signal.SIGKILL)
    os._exit(0)


def _start_guard(launcher_pid: int) -> None:
    """Fork the detached guard of this process's group (this process becomes the rank)."""
    rank_pid = os.getpid()
    launcher_fd = _pidfd(launcher_pid)
    rank_fd = _pidfd(rank_pid)
    if os.getppid() != launcher_pid:
        os._exit(128 + int(signal.SIGKILL))  # the launcher died already
    try:
        child = os.fork()
    except OSError as exc:
        sys.stderr.write(f"ft_launcher: cannot start the rank's guard: {exc}\n")
        return
    if child == 0:
        try:
            if os.fork() == 0:
                _guard(launcher_pid, launcher_fd, rank_pid, rank_fd)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    for fd in (launcher_fd, rank_fd):
        if fd is not None:
            os.close(fd)


def shim_argv(launcher_pid: int, monitor_socket: str, command: Sequence[str]) -> list[str]:
    """The shim's arguments after its script path; :func:`parse_shim_argv` reads them back.

    ``monitor_socket`` is exported as :data:`MONITOR_SOCKET_ENV`; empty for none.
    """
    return [str(launcher_pid), monitor_socket, *command]


def parse_shim_argv(args: Sequence[str]) -> tuple[int, str, list[str]]:
    """(launcher pid, monitor socket, command) from what :func:`shim_argv` built."""
    return int(args[0]), args[1], list(args[2:])


def _main(argv: list[str]) -> None:
    launcher_pid, monitor_socket, command = parse_shim_argv(argv[1:])
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            sys.stderr.write(f"ft_launcher: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}\n")
    if os.getppid() != launcher_pid:
        # The launcher died before the death signal was armed.
        os._exit(128 + int(signal.SIGKILL))
    if os.getpgrp() == os.getpid():
        # Our own process group (torch's start_new_session): guard it.
        _start_guard(launcher_pid)
    if monitor_socket:
        os.environ[MONITOR_SOCKET_ENV] = monitor_socket
    os.execvp(command[0], command)  # noqa: S606 - argv list, no shell


if __name__ == "__main__":
    _main(sys.argv)
