"""A wall-clock step does not stall the launcher's waits (they use time.monotonic).

The hang-evidence wait (after a hang's first report, wait briefly for the other local
ranks' reports) once measured its deadline with the wall clock: stepping the clock back
an hour right after the report stalled the restart decision by an hour. Here the wait
runs with an injected clock whose wall time steps back an hour at its first wait, while
a real rank process that never reports keeps it from ending early.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.ft._events import RankTerminated
from nvrx.launcher import ExitCode, _hang_wait
from nvrx.launcher._cycle_state import CycleState

pytestmark = pytest.mark.timeout(60)

STEP_BACK_S = 3600.0


class _SteppedClock:
    """time.monotonic advances only by what the code waits; time.time steps back once."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = time.time()
        self.waits = 0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def wait(self, timeout: float) -> None:
        if self.waits == 0:
            self.wall -= STEP_BACK_S  # an operator or NTP steps the clock back
        self.waits += 1
        self.mono += timeout
        self.wall += timeout


@pytest.fixture
def silent_rank() -> Iterator[subprocess.Popen[bytes]]:
    """A real rank process that neither reports nor exits while the wait runs."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_hang_evidence_wait_ends_on_time_when_the_wall_clock_steps_back(
    monkeypatch: pytest.MonkeyPatch, silent_rank: subprocess.Popen[bytes]
) -> None:
    clock = _SteppedClock()
    monkeypatch.setattr(
        _hang_wait, "time", types.SimpleNamespace(monotonic=clock.monotonic, time=clock.time)
    )
    cycle = CycleState(number=0, started=clock.time(), progress=None)
    report = RankTerminated(
        local_rank=0, rank=0, pid=1, cause="heartbeat_timeout", message="no heartbeat"
    )
    cycle.terminated[0] = report
    cycle.first_report = clock.time()
    cycle.first_report_mono = clock.monotonic()
    culprit = subprocess.Popen([sys.executable, "-c", "pass"])
    culprit.wait(timeout=30)  # the reported rank exited on its monitor's signal
    handlers = {
        0: cast(Any, types.SimpleNamespace(proc=culprit)),
        1: cast(Any, types.SimpleNamespace(proc=silent_rank)),
    }
    drained: list[int] = []

    waited_for = _hang_wait.await_hang_evidence(
        cycle, handlers, wait=clock.wait, drain=lambda: drained.append(clock.waits)
    )
    assert waited_for is True
    waited = clock.monotonic() - cycle.first_report_mono
    # It waited its bound, not the bound plus the hour the wall clock went back.
    assert waited == pytest.approx(_hang_wait.HANG_EVIDENCE_WAIT_S, abs=0.1)
    assert clock.waits <= _hang_wait.HANG_EVIDENCE_WAIT_S / 0.05 + 2
    assert drained == list(range(1, clock.waits + 1))  # the events taken in after each wait
    assert silent_rank.poll() is None


_BACKWARD_CLOCK = """
import os, time
if os.environ.pop("NVRX_TEST_WALL_CLOCK_BACKWARD", None):  # this process only
    _wall0, _mono0 = time.time(), time.monotonic()
    time.time = lambda: _wall0 - 3600.0 - (time.monotonic() - _mono0)
    time.time_ns = lambda: int(time.time() * 1e9)
"""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_real_job_restarts_after_a_hang_while_the_wall_clock_runs_backward(
    start_launcher: Callable[..., Launcher], tmp_path: pathlib.Path
) -> None:
    """The launcher's wall clock starts an hour back and runs backward from there: every
    read is a step back. Hang detection, the evidence wait, the decision and the restart
    still happen (a wall-clock deadline anywhere on that path would never be reached)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BACKWARD_CLOCK)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    journal = tmp_path / "journal.jsonl"
    launcher = start_launcher(
        [
            "--nproc-per-node", "2", "--max-restarts", "1",
            "--ft-rank-heartbeat-timeout", "4", "--ft-journal", str(journal),
        ],
        ["--steps", "6", "--fault", "sleep:1:3"],
        env={"PYTHONPATH": path, "NVRX_TEST_WALL_CLOCK_BACKWARD": "1"},
    )  # fmt: skip
    assert launcher.wait(200) == ExitCode.SUCCESS, launcher.log()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert any(r["event"] == "rank_terminated_by_monitor" for r in records), launcher.log()
    restarted = [r for r in records if r["event"] == "restart"]
    assert len(restarted) == 1, launcher.log()
    assert restarted[0]["total_s"] >= 0  # durations are monotonic, whatever the labels say
    assert records[-1]["t"] < records[0]["t"]  # the labels did run backward
