"""Real ft_launcher jobs: the log names a crash at once, and the culprit last after a hang."""

from __future__ import annotations

import json
import pathlib
import re
import signal
from collections.abc import Callable

import psutil
import pytest
from launcher_testkit import Launcher, wait_for  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

Start = Callable[..., Launcher]


@pytest.mark.timeout(150)
def test_a_crash_is_named_before_the_survivors_are_stopped(start_launcher: Start) -> None:
    # The survivor ignores SIGTERM, so stopping it takes the whole stop timeout; the
    # crash line must already be there while it still runs.
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--workers-stop-timeout", "120"],
        ["--steps", "50", "--step-time", "0.1", "--fault", "sigkill:1:3", "--ignore-sigterm"],
    )
    pattern = re.compile(
        r"rank 1 \(local rank 1, pid (\d+)\) was killed by signal SIGKILL in cycle 0; "
        r"stopping the other ranks"
    )
    wait_for(lambda: pattern.search(launcher.log()) is not None, 90, "the crash line")
    survivors = [
        p for p in launcher.running("train_script.py") if p.status() != psutil.STATUS_ZOMBIE
    ]
    assert survivors, launcher.log()  # rank 0 still runs: the line came first
    log = launcher.log()
    assert "stopping with exit code" not in log
    for proc in survivors:  # end the wait instead of sitting out the stop timeout
        proc.send_signal(signal.SIGKILL)
    assert launcher.wait() != ExitCode.SUCCESS
    log = launcher.log()
    (named,) = list(pattern.finditer(log))
    assert named.start() < log.index("stopping with exit code"), log


@pytest.mark.timeout(180)
def test_the_culprit_line_comes_after_the_hung_ranks_tracebacks(
    start_launcher: Start, tmp_path: pathlib.Path
) -> None:
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", "2", "--max-restarts", "0",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
        ],
        ["--steps", "8", "--fault", "sleep:1:4"],
    )  # fmt: skip
    assert launcher.wait(160) != ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    (finding,) = [r for r in records if r["event"] == "hang_attributed"]
    lines = launcher.log().splitlines()
    last_named = max(i for i, line in enumerate(lines) if finding["sentence"] in line)
    # Whatever the ranks print while they are stopped (gloo's tracebacks, the stack
    # dumps) comes before the last line naming the culprit, so it is not buried.
    rank_output = [i for i, line in enumerate(lines) if "Traceback" in line]
    assert all(i < last_named for i in rank_output), "\n".join(lines[-60:])
    assert "stopping with exit code" in lines[last_named]
