"""Helpers for tests that run real ft_launcher processes (imported by the test modules)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

TRAIN_SCRIPT = pathlib.Path(__file__).with_name("train_script.py")

#: Options that make the monitors quick to act, for every launcher in the tests.
FAST_FT = [
    "--monitor-interval",
    "0.1",
    "--workers-stop-timeout",
    "5",
    "--ft-workload-check-interval",
    "0.1",
    "--ft-initial-rank-heartbeat-timeout",
    "120",
    "--ft-rank-heartbeat-timeout",
    "60",
    "--ft-rank-termination-grace-period",
    "2",
]


def run_launcher_group(
    args: list[str], *, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m nvrx.launcher ARGS`` in a process group of its own.

    If it does not end within ``timeout`` (or the wait fails), SIGKILL that group by the
    launcher's PID and reap it, so neither the launcher nor its monitors outlive the
    test. A launcher that ended by itself is left alone: what it left behind is for the
    test to find, not to hide.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvrx.launcher", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    ended = False
    try:
        out, err = proc.communicate(timeout=timeout)
        ended = True
    finally:
        if not ended:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()
            proc.wait(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def read_events(out: pathlib.Path) -> list[dict[str, Any]]:
    """The JSON lines the training script appended."""
    path = out / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def all_gone(procs: list[psutil.Process]) -> bool:
    """True when none of ``procs`` runs any more (a zombie awaiting its reaper counts)."""
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll ``condition`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Launcher:
    """One ft_launcher process, its output file, and the training output directory."""

    def __init__(
        self,
        args: list[str],
        out: pathlib.Path,
        log: pathlib.Path,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.out = out
        self.log_path = log
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
        env.pop("NVRX_FT_MONITOR_SOCKET", None)
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvrx.launcher", *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self._seen: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        """Every live process under the launcher (ranks, monitors); remembered for later."""
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self._seen.update(p.pid for p in procs)
        return procs

    def running(self, fragment: str) -> list[psutil.Process]:
        """Live processes under the launcher whose command line contains ``fragment``."""
        out = []
        for proc in self.descendants():
            with contextlib.suppress(psutil.Error):
                if fragment in " ".join(proc.cmdline()):
                    out.append(proc)
        return out

    def monitor_pids(self) -> list[int]:
        return [proc.pid for proc in self.running("nvrx.ft._monitor_main")]

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"ft_launcher did not exit within {timeout:.0f} s; log:\n{self.log()[-4000:]}"
            ) from None

    def kill_tree(self) -> None:
        """SIGKILL the launcher and everything it ever started that is still alive."""
        procs = self.descendants()
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(self.proc.pid))
        for pid in self._seen:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self._log_file.close()
