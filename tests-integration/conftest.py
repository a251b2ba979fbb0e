"""Fixtures for the cross-package tests: real ft_launcher runs that never leak a process."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator, Sequence
from typing import Protocol

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from itest_harness import DDP_STEPS, FAST_FT, LauncherRun


class Launch(Protocol):
    """Signature of the ``launch`` fixture."""

    def __call__(
        self,
        script_args: Sequence[str] = (),
        launcher_args: Sequence[str] = (),
        *,
        script: pathlib.Path = DDP_STEPS,
        name: str = "launcher",
        nproc: int = 2,
        standalone: bool = True,
    ) -> LauncherRun: ...


@pytest.fixture
def out_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """Where the training scripts of a test write their journal and checkpoints."""
    out = tmp_path / "out"
    out.mkdir()
    return out


@pytest.fixture
def launch(tmp_path: pathlib.Path, out_dir: pathlib.Path) -> Iterator[Launch]:
    """Start ft_launcher runs; afterwards fail if any left a process behind, and kill all.

    ``launch(script_args, launcher_args)`` runs ``ft_launcher [FAST_FT] [--standalone]
    --nproc-per-node=N [launcher_args] SCRIPT --out OUT [script_args]`` in its own
    session; later ``launcher_args`` override ``FAST_FT``.
    """
    runs: list[LauncherRun] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(
        script_args: Sequence[str] = (),
        launcher_args: Sequence[str] = (),
        *,
        script: pathlib.Path = DDP_STEPS,
        name: str = "launcher",
        nproc: int = 2,
        standalone: bool = True,
    ) -> LauncherRun:
        args = [*FAST_FT, f"--nproc-per-node={nproc}"]
        if standalone:
            args.append("--standalone")
        args += [*launcher_args, str(script), "--out", str(out_dir), *script_args]
        run = LauncherRun(name, args, out_dir, logs)
        runs.append(run)
        return run

    try:
        yield start
    finally:
        problems = [problem for run in runs for problem in run.cleanup()]
        if problems:
            pytest.fail("processes left behind:\n" + "\n".join(problems), pytrace=False)
