"""A failed rank's traceback reaches the launcher's output and journal (torchrun's Root Cause)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


def _failures(log_dir: pathlib.Path) -> list[dict[str, Any]]:
    journal = [json.loads(line) for line in (log_dir / "ft_launcher_events.jsonl").open()]
    return [e for e in journal if e["event"] == "rank_failed"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redirects", [None, "3"])
def test_record_traceback_reaches_output_and_journal(
    start_launcher: Start, tmp_path: pathlib.Path, redirects: str | None
) -> None:
    log_dir = tmp_path / "logs"
    extra = ["--redirects", redirects] if redirects else []
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(log_dir), *extra],
        ["--steps", "6", "--fault", "raise:1:3", "--record"],
    )
    assert launcher.wait() == ExitCode.RESTARTS_EXHAUSTED, launcher.log()
    log = launcher.log()
    assert "root cause of rank 1 (local rank 1) failing, from its error file (@record)" in log
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: injected failure at step 3" in log
    [failed] = _failures(log_dir)
    cause = failed["root_cause"]
    assert cause["source"] == "error_file"
    assert cause["message"] == "RuntimeError: injected failure at step 3"
    assert "train_script.py" in cause["traceback"]


@pytest.mark.timeout(120)
def test_without_record_the_redirected_stderr_tail_stands_in(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    log_dir = tmp_path / "logs"
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(log_dir)],
        ["--steps", "6", "--fault", "raise:1:3"],
    )
    launcher.wait()
    [failed] = _failures(log_dir)
    assert failed["root_cause"] is None  # stderr went to the console: nothing to add
    launcher = start_launcher(
        [
            *("--nproc-per-node", "2", "--max-restarts", "0", "--log-dir", str(log_dir)),
            *("--redirects", "3", "--rdzv-id", "second"),
        ],
        ["--steps", "6", "--fault", "raise:1:3"],
        name="redirected",
    )
    assert launcher.wait() == ExitCode.RESTARTS_EXHAUSTED, launcher.log()
    assert "from its stderr" in launcher.log()
    cause = _failures(log_dir)[-1]["root_cause"]
    assert cause["source"] == "stderr"
    assert cause["message"].endswith("RuntimeError: injected failure at step 3")


@pytest.mark.timeout(120)
def test_a_garbage_error_file_does_not_end_the_launcher(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "1"],
        ["--steps", "6", "--fault", "bad_error_file:1:3"],
    )
    # Torch's ProcessFailure raises on it (exit 5 before); we restart as for any crash.
    assert launcher.wait() == ExitCode.SUCCESS, launcher.log()
    assert "restart 1/1" in launcher.log()
