"""The harness's leak check can fail, and a rank's setsid'd process does not escape.

A rank that starts a process in a new session (``setsid``, directly or by the classic
double fork) takes it out of its process group; the launcher, a child subreaper, gets
it when it is orphaned and kills it when it ends (issue 26, item 9). The leak check is
still shown to catch a marked process that outlives a launcher.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import psutil
import pytest
from itest_harness import FAST_FT, MARKER_ENV, LauncherRun

pytestmark = pytest.mark.multiprocess

LEAKY = pathlib.Path(__file__).resolve().parent / "scripts" / "leaky.py"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["setsid", "double-fork"])
def test_a_process_a_rank_starts_in_a_new_session_does_not_outlive_the_launcher(
    tmp_path: pathlib.Path, how: str
) -> None:
    extra = ["--double-fork"] if how == "double-fork" else []
    args = [*FAST_FT, "--standalone", "--nproc-per-node=1", str(LEAKY), "--out", str(tmp_path)]
    run = LauncherRun("leaky", [*args, *extra], tmp_path, tmp_path)
    leaked = None
    try:
        run.expect_exit(0, timeout=90)
        leaked = int((tmp_path / "leaked.pid").read_text())
        # Gone when the launcher is: killed and reaped by it, not left to init.
        assert _gone(leaked), psutil.Process(leaked).cmdline()
    finally:
        problems = run.cleanup(grace=1.0)
    assert problems == [], problems
    assert "killed 1 process(es) the job left behind" in run.log(), run.log()[-3000:]


@pytest.mark.timeout(150)
def test_what_a_rank_left_in_a_new_session_dies_before_the_next_cycle(
    tmp_path: pathlib.Path,
) -> None:
    args = [*FAST_FT, "--standalone", "--nproc-per-node=1", "--max-restarts=1"]
    script = [str(LEAKY), "--out", str(tmp_path), "--fail-first-cycle"]
    run = LauncherRun("leaky", [*args, *script], tmp_path, tmp_path)
    try:
        run.expect_exit(0, timeout=120)
        leaked = int((tmp_path / "leaked.pid").read_text())
        assert (tmp_path / "next_cycle.txt").read_text() == "gone"
        assert _gone(leaked)
    finally:
        problems = run.cleanup(grace=1.0)
    assert problems == [], problems
    assert (
        f"the last cycle's ranks left running (outside their process groups): pids [{leaked}]"
        in (run.log())
    ), run.log()[-3000:]
    assert "process(es) the job left behind" not in run.log(), "nothing was left for the end"


@pytest.mark.timeout(120)
def test_leak_check_reports_and_kills_an_escaped_process(tmp_path: pathlib.Path) -> None:
    run = LauncherRun(
        "leaky",
        [*FAST_FT, "--standalone", "--nproc-per-node=1", str(LEAKY), "--out", str(tmp_path)],
        tmp_path,
        tmp_path,
    )
    # A marked process the launcher never had: what an escape would look like.
    escaped = subprocess.Popen(
        ["sleep", "120"], env=dict(os.environ, **{MARKER_ENV: run.marker}), start_new_session=True
    )
    try:
        run.expect_exit(0, timeout=90)
        assert run.runtime_dirs(), "the monitors' log format changed: runtime dir not found"
        assert psutil.pid_exists(escaped.pid)
    finally:
        problems = run.cleanup(grace=1.0)
        escaped.wait(10)
    assert len(problems) == 1, problems
    assert f"pid {escaped.pid}: sleep 120" in problems[0]
