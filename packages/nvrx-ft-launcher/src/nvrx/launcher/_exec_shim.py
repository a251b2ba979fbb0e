"""How a child of the launcher is tied to it: the exec shim put in front of its command.

``_worker_exec.py`` arms PR_SET_PDEATHSIG (the child is SIGKILLed when the launcher
dies), checks the launcher is still its parent, exports the monitor socket and execs
the real command. Ranks and warm spares both start through it.
"""

from __future__ import annotations

import os
import pathlib
import sys

from ._worker_exec import shim_argv

__all__ = ["EXEC_SHIM", "shim_args", "shimmed"]

#: The shim script; a rank's argv holds it, which is how a handler recognises one.
EXEC_SHIM = str(pathlib.Path(__file__).with_name("_worker_exec.py"))


def shim_args(monitor_socket: str, command: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Arguments for ``sys.executable`` that run ``command`` through the shim.

    ``monitor_socket`` is exported as NVRX_FT_MONITOR_SOCKET; empty for none. What follows
    the script is built and parsed by ``_worker_exec`` (``shim_argv``/``parse_shim_argv``).
    """
    return ("-I", "-S", EXEC_SHIM, *shim_argv(os.getpid(), monitor_socket, command))


def shimmed(command: tuple[str, ...] | list[str]) -> list[str]:
    """The full argv of a launcher child with no monitor socket (e.g. a warm spare)."""
    return [sys.executable, *shim_args("", command)]
