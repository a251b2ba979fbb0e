"""The harness's leak check can fail: a process that escapes ft_launcher is caught."""

from __future__ import annotations

import pathlib

import psutil
import pytest
from itest_harness import FAST_FT, LauncherRun

pytestmark = pytest.mark.multiprocess

LEAKY = pathlib.Path(__file__).resolve().parent / "scripts" / "leaky.py"


@pytest.mark.timeout(120)
def test_leak_check_reports_and_kills_an_escaped_process(tmp_path: pathlib.Path) -> None:
    run = LauncherRun(
        "leaky",
        [*FAST_FT, "--standalone", "--nproc-per-node=1", str(LEAKY), "--out", str(tmp_path)],
        tmp_path,
        tmp_path,
    )
    try:
        run.expect_exit(0, timeout=90)
        assert run.runtime_dirs(), "the monitors' log format changed: runtime dir not found"
        leaked = int((tmp_path / "leaked.pid").read_text())
        assert psutil.pid_exists(leaked)
    finally:
        problems = run.cleanup(grace=1.0)
    assert len(problems) == 1, problems
    assert f"pid {leaked}: sleep 120" in problems[0]
    assert not psutil.pid_exists(leaked) or psutil.Process(leaked).status() == "zombie"
