"""A warm spare: a Python that imports the heavy modules early, then becomes a rank.

Run as ``python [-u] _warm_spare.py FD MODULE[,MODULE...] [COMMAND...]`` through the
exec shim, which ties it to the launcher as it does a rank (COMMAND, the rank's
program, is only there for ``ps`` to show). It imports the modules (torch by default)
while the current ranks train, then waits on socket ``FD`` for one JSON message: the
rank's argv, environment and, as passed descriptors, its stdout and stderr. It then
runs the script (or ``-m`` module) as ``__main__``, exactly as ``python`` would, so a
restart skips the seconds that interpreter start-up and ``import torch`` take.

An empty read (the launcher closed the socket) means it is not needed: it exits 0.
Standard library only; what it receives is JSON, never pickle.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import socket
import sys

__all__: list[str] = []

_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def _preload(modules: str) -> None:
    # A module that fails to import here fails again, with the user's own traceback,
    # when the script imports it: nothing to report from the spare.
    for name in filter(None, modules.split(",")):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 - see above
            continue


def _receive(fd: int) -> tuple[dict[str, object], list[int]]:
    with socket.socket(fileno=fd) as sock:
        data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE_BYTES, 2)
    if not data:
        os._exit(0)
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("the launcher's message is not a JSON object")
    return message, list(fds)


def _become_rank(message: dict[str, object], fds: list[int]) -> None:
    """Take the rank's streams, environment and argv, then run its program as __main__."""
    streams = message.get("streams", [])
    assert isinstance(streams, list)
    for target, fd in zip(streams, fds, strict=True):
        os.dup2(fd, int(target))
        os.close(fd)
    env = message["env"]
    argv = message["argv"]
    assert isinstance(env, dict)
    assert isinstance(argv, list)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


def _main(argv: list[str]) -> None:
    fd = int(argv[1])
    _preload(argv[2])
    message, fds = _receive(fd)
    _become_rank(message, fds)


if __name__ == "__main__":
    _main(sys.argv)
