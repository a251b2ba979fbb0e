"""Exec shim run between the launcher and each rank: ties the rank's life to the launcher.

Run as ``python -I -S _worker_exec.py LAUNCHER_PID MONITOR_SOCKET CMD [ARGS...]``. It asks
the kernel to SIGKILL this process when the launcher dies (PR_SET_PDEATHSIG survives
exec), checks the launcher did not die before that, puts the monitor socket in the
environment and execs the real command. Standard library only, so it costs one bare
interpreter start (about 20 ms); ``subprocess.Popen`` gives no other hook to run code
in the child before exec.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1
_MONITOR_SOCKET_ENV = "NVRX_FT_MONITOR_SOCKET"


def _main(argv: list[str]) -> None:
    launcher_pid = int(argv[1])
    monitor_socket = argv[2]
    command = argv[3:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            sys.stderr.write(f"ft_launcher: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}\n")
    if os.getppid() != launcher_pid:
        # The launcher died before the death signal was armed.
        os._exit(128 + int(signal.SIGKILL))
    if monitor_socket:
        os.environ[_MONITOR_SOCKET_ENV] = monitor_socket
    os.execvp(command[0], command)  # noqa: S606 - argv list, no shell


if __name__ == "__main__":
    _main(sys.argv)
