"""This node's ranks as processes: their state at a tick, and the last-resort kill.

:func:`check_workers` is the agent's own poll of its ranks (failed, running or done);
:data:`WORKERS` maps torch's worker states to what :func:`._cycle_end.cycle_end` reads;
:func:`kill_process_groups` SIGKILLs what is left of the ranks on the way out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Container

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.multiprocessing.api import SubprocessContext
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from ._cycle_end import Workers
from ._root_cause import process_failure

__all__: list[str] = []

#: torch's worker states as :func:`._cycle_end.cycle_end` reads them (others: healthy).
WORKERS = {
    WorkerState.SUCCEEDED: Workers.SUCCEEDED,
    WorkerState.FAILED: Workers.FAILED,
    WorkerState.UNKNOWN: Workers.PIDS_MISMATCH,
    WorkerState.UNHEALTHY: Workers.UNINTERRUPTIBLE,
}


def check_workers(
    pc: SubprocessContext, worker_group: WorkerGroup, terminated: Container[int]
) -> RunResult:
    """This node's ranks: failed, running or done.

    A rank its monitor terminated (a local rank in ``terminated``) has failed whatever
    its exit code (a SIGTERM handler may exit 0). Nothing is stopped here: the siblings
    of a failed rank are stopped by the decision.
    """
    failures: dict[int, ProcessFailure] = {}
    running = False
    for local_rank, handler in pc.subprocess_handlers.items():
        exitcode = handler.proc.poll()
        if exitcode is None:
            running = True
        elif exitcode != 0 or local_rank in terminated:
            worker = worker_group.workers[local_rank]
            failures[worker.global_rank] = process_failure(
                local_rank, handler.proc.pid, exitcode, pc.error_files[local_rank]
            )
    if failures:
        return RunResult(state=WorkerState.FAILED, failures=failures)
    if running:
        return RunResult(state=WorkerState.HEALTHY)
    return RunResult(
        state=WorkerState.SUCCEEDED,
        return_values={w.global_rank: None for w in worker_group.workers},
    )


def kill_process_groups(pc: SubprocessContext | None, timeout: float) -> None:
    """SIGKILL the process group of every rank still alive and reap it (``timeout`` in all)."""
    if pc is None:
        return
    alive = [h.proc for h in pc.subprocess_handlers.values() if h.proc.poll() is None]
    for proc in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for proc in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
