"""Warm spares: the next ranks' interpreters, started and importing torch before a failure.

After a crash most of the time to the first step is each new rank starting Python and
importing torch (seconds), not the launcher's work (a fraction of one). With
``--warm-spares`` the launcher keeps one spare per local rank once the current ranks
are up: a Python that has imported the ``--warm-spare-preload`` modules and waits.
At the restart torch's agent builds each rank's command and environment as always;
instead of starting a fresh process, :class:`SpareHandler` hands them to the spare
(JSON over a socket pair, the stdout/stderr files as passed descriptors), and the
spare runs the script as ``__main__``. A rank with no usable spare starts cold, as
without the option.

Torch creates its ``SubprocessHandler`` objects through a module-level factory;
:func:`spare_handlers` points it at :class:`SpareHandler` while the agent starts
workers, and the handler's ``_popen`` is the one method it changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from nvrx.ft import MONITOR_SOCKET_ENV

from . import _torch_compat as compat
from ._cycle_state import CycleState
from ._exec_shim import EXEC_SHIM, shimmed
from ._worker_exec import parse_shim_argv

__all__ = [
    "DEFAULT_PRELOAD",
    "SAFE_FLAGS",
    "PythonCommand",
    "SpareHandler",
    "SparePool",
    "python_command",
    "spare_command",
    "spare_handlers",
]

#: What a spare imports by default (``--warm-spare-preload``). ``torch._dynamo`` because
#: DDP's constructor imports it on first use (torch 2.13: some 800 modules): a warm
#: restart of a DDP rank took 7.4 s with torch alone, 0.45 s with both
#: (benchmarks/bench_launcher_realistic.py); it costs each spare about 1.8 CPU-seconds
#: and 73 MiB, paid while the job trains.
DEFAULT_PRELOAD: tuple[str, ...] = ("torch", "torch._dynamo")

logger = logging.getLogger("nvrx.launcher")

#: How long after a cycle's start its spares start even if not every rank is up.
SPARES_AFTER_S = 10.0
_SPARE_PROGRAM = str(pathlib.Path(__file__).with_name("_warm_spare.py"))
#: Interpreter options a spare can be started with: they change nothing the rank's
#: environment could disagree with later.
SAFE_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-E"})


@dataclasses.dataclass(frozen=True)
class PythonCommand:
    """A rank command of the form ``python [flags] (script | -m module) [args]``."""

    interpreter: str
    flags: tuple[str, ...]
    program: tuple[str, ...]


def python_command(command: Sequence[str]) -> PythonCommand | None:
    """Split ``command`` if a spare can run it; None for anything else (e.g. --no-python)."""
    if not command or command[0] != sys.executable:
        return None
    flags: list[str] = []
    rest = list(command[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] not in SAFE_FLAGS:
            return None
        flags.append(rest.pop(0))
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        return None
    return PythonCommand(command[0], tuple(flags), tuple(rest))


def spare_command(command: PythonCommand, preload: Sequence[str], fd: int) -> list[str]:
    """The argv of a spare that will run ``command``, reading its orders from ``fd``.

    It starts through the exec shim, so it dies with the launcher like a rank. The
    rank's program comes last only for ``ps`` to show; the spare ignores it.
    """
    return shimmed(
        [
            command.interpreter,
            *command.flags,
            _SPARE_PROGRAM,
            str(fd),
            ",".join(preload),
            *command.program,
        ]
    )


@dataclasses.dataclass
class _Spare:
    proc: subprocess.Popen[bytes]
    sock: socket.socket


class SparePool:
    """One warm spare per local rank, started on demand and handed over at a restart."""

    def __init__(self, command: PythonCommand, preload: Sequence[str], slots: int) -> None:
        self._command = command
        self._preload = tuple(preload)
        self._slots = slots
        self._spares: dict[int, _Spare] = {}

    @property
    def command(self) -> PythonCommand:
        """The interpreter and flags every spare runs with."""
        return self._command

    def fill_when_up(self, cycle: CycleState, local_world_size: int) -> None:
        """Fill the pool once per cycle, once its ranks are up.

        Warm spares start once every rank of the cycle connected to its monitor (its own
        start-up is over, so they do not compete with it), or :data:`SPARES_AFTER_S`
        after the cycle started regardless.
        """
        if cycle.spares_started:
            return
        up = len(cycle.connected) >= local_world_size
        if up or time.monotonic() - cycle.started_mono >= SPARES_AFTER_S:
            cycle.spares_started = True
            started = self.fill()
            logger.debug("warm spares started for local ranks %s", started)

    def fill(self) -> list[int]:
        """Start a spare for every local rank that has none; returns those local ranks."""
        self._drop_dead()
        started = []
        for local_rank in range(self._slots):
            if local_rank not in self._spares:
                self._spares[local_rank] = self._start()
                started.append(local_rank)
        return started

    def _start(self) -> _Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                spare_command(self._command, self._preload, theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # torch stops a rank with killpg(pid)
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Spare(proc, ours)

    def _drop_dead(self) -> None:
        for local_rank, spare in list(self._spares.items()):
            if spare.proc.poll() is not None:
                logger.warning(
                    "the warm spare of local rank %d exited (code %s) before it was needed",
                    local_rank,
                    spare.proc.returncode,
                )
                spare.sock.close()
                del self._spares[local_rank]

    def hand_over(
        self,
        local_rank: int,
        program: Sequence[str],
        env: dict[str, str],
        streams: Mapping[int, IO[Any]],
    ) -> subprocess.Popen[bytes] | None:
        """Make the spare of ``local_rank`` run ``program``; None if it has no usable spare.

        ``streams`` maps 1 and/or 2 to the open files the rank's stdout and stderr go to.
        """
        self._drop_dead()
        spare = self._spares.pop(local_rank, None)
        if spare is None:
            return None
        message = json.dumps(
            {"argv": list(program), "env": env, "streams": sorted(streams)},
            separators=(",", ":"),
        ).encode()
        fds = [streams[target].fileno() for target in sorted(streams)]
        try:
            socket.send_fds(spare.sock, [message], fds)
        except OSError as exc:
            logger.warning("could not hand local rank %d to its warm spare: %s", local_rank, exc)
            _kill(spare.proc)
            return None
        finally:
            spare.sock.close()
        return spare.proc

    def close(self) -> None:
        """SIGKILL every spare not handed over and reap it: none has run user code yet."""
        spares, self._spares = list(self._spares.values()), {}
        for spare in spares:
            spare.sock.close()
            _kill(spare.proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


class SpareHandler(SubprocessHandler):
    """Torch's handler for one rank process, taking the rank's warm spare when it has one."""

    def __init__(self, pool: SparePool, **kwargs: Any) -> None:
        self._pool = pool
        self.warm = False
        super().__init__(**kwargs)

    def _popen(self, args: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = self._warm_popen(args, env)
        if proc is None:
            return super()._popen(args, env)
        self.warm = True
        return proc

    def _warm_popen(
        self, args: tuple[str, ...], env: dict[str, str]
    ) -> subprocess.Popen[bytes] | None:
        # args is ``python -I -S <shim> LAUNCHER_PID MONITOR_SOCKET <command>``, unless
        # something (numactl) wrapped it, in which case the rank starts cold.
        if EXEC_SHIM not in args:
            return None
        _launcher, monitor_socket, rank_command = parse_shim_argv(args[args.index(EXEC_SHIM) + 1 :])
        command = python_command(rank_command)
        pool_command = self._pool.command
        if command is None or (command.interpreter, command.flags) != (
            pool_command.interpreter,
            pool_command.flags,
        ):
            return None
        rank_env = dict(env)
        if monitor_socket:
            rank_env[MONITOR_SOCKET_ENV] = monitor_socket
        streams = {
            target: stream
            for target, stream in ((1, self._stdout), (2, self._stderr))
            if stream is not None
        }
        return self._pool.hand_over(self.local_rank_id, command.program, rank_env, streams)


@contextlib.contextmanager
def spare_handlers(pool: SparePool | None) -> Iterator[list[SpareHandler]]:
    """While open, torch's workers start through :class:`SpareHandler` (if ``pool``).

    Yields the handlers created, so the caller can tell which ranks started warm.
    """
    created: list[SpareHandler] = []
    if pool is None:
        yield created
        return

    def factory(**kwargs: Any) -> SubprocessHandler:
        handler = SpareHandler(pool, **kwargs)
        created.append(handler)
        return handler

    with compat.subprocess_handler_factory(factory) as installed:
        if not installed:
            logger.warning("this torch has no subprocess handler factory: ranks start cold")
        yield created
