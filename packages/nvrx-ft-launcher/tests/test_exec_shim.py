"""The exec shim's contract: one module builds and parses its argv, one variable name."""

from __future__ import annotations

import os
import subprocess
import sys

import nvrx.ft
from nvrx.launcher import _worker_exec
from nvrx.launcher._exec_shim import EXEC_SHIM, shim_args


def test_the_shim_argv_round_trips() -> None:
    args = shim_args("/run/x/monitor-${local_rank}.sock", ["python", "-m", "train", "--lr=1"])
    assert args[:3] == ("-I", "-S", EXEC_SHIM)
    assert _worker_exec.parse_shim_argv(args[3:]) == (
        os.getpid(),
        "/run/x/monitor-${local_rank}.sock",
        ["python", "-m", "train", "--lr=1"],
    )


def test_the_shim_exports_the_variable_ranks_read() -> None:
    """The shim (standard library only) names nvrx.ft's variable; a real run shows it."""
    assert nvrx.ft.MONITOR_SOCKET_ENV == _worker_exec.MONITOR_SOCKET_ENV
    show = f"import os; print(os.environ.get({nvrx.ft.MONITOR_SOCKET_ENV!r}))"
    done = subprocess.run(
        [sys.executable, *shim_args("/tmp/m.sock", [sys.executable, "-c", show])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "/tmp/m.sock"
