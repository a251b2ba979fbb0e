"""Fixtures that run real ft_launcher processes and always clean up after them."""

from __future__ import annotations

import logging
import pathlib
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from launcher_testkit import FAST_FT, TRAIN_SCRIPT, Launcher  # type: ignore[import-not-found]


@pytest.fixture
def start_launcher(tmp_path: pathlib.Path) -> Iterator[Callable[..., Launcher]]:
    """Start launchers with ``start_launcher(launcher_args, script_args)``; all are killed after."""
    started: list[Launcher] = []
    out = tmp_path / "out"
    out.mkdir()

    def start(
        launcher_args: list[str],
        script_args: list[str] | None = None,
        *,
        name: str = "launcher",
        env: dict[str, str] | None = None,
    ) -> Launcher:
        launcher_args = [a.replace("{out}", str(out)) for a in launcher_args]
        args = [*FAST_FT, *launcher_args, str(TRAIN_SCRIPT), "--out", str(out)]
        args += script_args or []
        launcher = Launcher(args, out, tmp_path / f"{name}.log", env)
        started.append(launcher)
        return launcher

    try:
        yield start
    finally:
        for launcher in started:
            launcher.kill_tree()


@pytest.fixture(autouse=True)
def _restore_launcher_logger() -> Iterator[None]:
    """An in-process ``cli.main`` points the launcher's logger at that test's captured
    stderr; put it back after the test so later tests' warnings are not written to a
    closed stream ("--- Logging error ---")."""
    launcher_logger = logging.getLogger("nvrx.launcher")
    saved = (launcher_logger.handlers[:], launcher_logger.level, launcher_logger.propagate)
    yield
    launcher_logger.handlers[:], launcher_logger.level, launcher_logger.propagate = saved


@pytest.fixture
def scripts_here(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Run in a fresh directory holding the training scripts tests name (x.py, t.py,
    train.py): ft_launcher refuses a script that does not exist, at start-up."""
    for name in ("x.py", "t.py", "train.py"):
        (tmp_path / name).touch()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def _stop_nonce_answering() -> Iterator[None]:
    """An in-process launcher (or JobCoordinator) with a job key leaves a thread that
    answers its run nonce's challenges until the launcher ends; end it after the test."""
    yield
    from nvrx.launcher._run_nonce import stop_answering

    stop_answering()
