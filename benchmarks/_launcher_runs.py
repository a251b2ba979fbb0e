"""What the launcher benchmarks share: a quiet environment, the rank's event file, reaping.

Every benchmark that starts ``ft_launcher`` starts it through :func:`start_launcher`, in
its own process group, and ends it with :func:`reap`, which kills that group and every
process still under the launcher by PID, so a failed measurement leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, TypeVar

import psutil

__all__ = [
    "Launched",
    "bench_env",
    "read_jsonl",
    "reap",
    "spares_idle",
    "start_launcher",
    "wait_for",
]

T = TypeVar("T")


def bench_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark's launcher: one OpenMP thread, no inherited monitor."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(extra or {}))
    env.pop("NVRX_FT_MONITOR_SOCKET", None)
    return env


def read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (a torn last line is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def wait_for(cond: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``cond`` every 10 ms until it returns something true; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.01)
    raise RuntimeError(f"benchmark timed out waiting for {what}")


class Launched:
    """One ft_launcher process started by a benchmark, with its log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.proc = proc
        self._log = log
        self._seen: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def remember_children(self) -> None:
        """Note every process under the launcher now, so :func:`reap` finds it later."""
        with contextlib.suppress(psutil.Error):
            self._seen.update(p.pid for p in psutil.Process(self.proc.pid).children(recursive=True))

    def close_log(self) -> None:
        self._log.close()


def start_launcher(
    argv: Sequence[str], log: pathlib.Path, *, env: dict[str, str] | None = None
) -> Launched:
    """Start ``argv`` (a launcher command line) in a new process group, output to ``log``."""
    handle = log.open("wb")
    proc = subprocess.Popen(
        list(argv),
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env if env is not None else bench_env(),
        start_new_session=True,
    )
    return Launched(proc, handle)


def reap(launched: Sequence[Launched], *, grace: float = 30.0) -> None:
    """End each launcher (SIGTERM, then SIGKILL after ``grace``) and all it started.

    Ranks live in process groups of their own, so they are found by PID: every process
    ever seen under a launcher, and those under it now, are SIGKILLed if still alive.
    """
    for item in launched:
        item.remember_children()
    for item in launched:
        if item.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                item.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for item in launched:
        with contextlib.suppress(subprocess.TimeoutExpired):
            item.proc.wait(max(0.1, deadline - time.monotonic()))
    procs: list[psutil.Process] = []
    for item in launched:
        for pid in (item.pid, *item._seen):
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)
    for item in launched:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(item.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            item.proc.wait(10)
        item.close_log()


def is_spare(argv: list[str]) -> bool:
    """A warm spare's argv, not its guard's (which runs the exec shim)."""
    return any(a.endswith("_warm_spare.py") for a in argv) and not any(
        a.endswith("_worker_exec.py") for a in argv
    )


def spares_idle(launcher: int, ranks: set[int], count: int) -> bool:
    """True when the launcher has ``count`` warm spares and all wait (imports done).

    Ranks started from spares run the spare program too: ``ranks`` are their pids. Each
    spare's guard (the exec shim's detached copy, re-parented to the launcher, its
    subreaper) names the spare program in its argv too, after ``_worker_exec.py``.
    """
    try:
        spares = [
            p
            for p in psutil.Process(launcher).children()
            if p.pid not in ranks and is_spare(p.cmdline())
        ]
        if len(spares) != count:
            return False
        before = [sum(p.cpu_times()[:2]) for p in spares]
        time.sleep(0.3)
        after = [sum(p.cpu_times()[:2]) for p in spares]
    except psutil.Error:
        return False
    return before == after
