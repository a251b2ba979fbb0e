"""The fault matrix, rank side: every kind of rank fault is survived by an in-job restart.

Each case is a real ft_launcher run of ``scripts/ddp_steps.py`` with 2 ranks on CPU
(gloo). It checks the launcher's exit code, the cause the launcher gives for each
restart (its cycle log), that training ran every step exactly once across the
restarts (resume from the last checkpoint), and, through the ``launch`` fixture, that
no process of the run is left behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
from conftest import Launch
from itest_harness import Event, assert_every_step_once, matches, restart_reasons

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS = 12
#: sum over steps s and ranks r of s * (r + 1), for 2 ranks: what an exactly-once run totals.
EXPECTED_TOTAL = 3 * STEPS * (STEPS + 1) // 2
CHECKPOINT_EVERY = 3
RANK1 = r"rank 1 \(local rank 1, pid \d+\)"


@dataclasses.dataclass(frozen=True)
class Fault:
    """One injected rank fault and the restart cause the launcher must report for it."""

    spec: str
    cause: str
    script_args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()
    #: The checkpoint attempt 1 resumes from, where the fault's timing makes it exact.
    resume: int | None = CHECKPOINT_EVERY


FAULTS = {
    "sigkill": Fault("sigkill:1:5:0", rf"{RANK1} was killed by signal SIGKILL"),
    "exception": Fault("raise:1:5:0", rf"{RANK1} exited with code 1"),
    "exit-nonzero": Fault("exit:1:5:0", rf"{RANK1} exited with code 7"),
    "sigstop-hang": Fault(
        "sigstop:1:5:0",
        rf"{RANK1} [^;]+; its monitor terminated it: heartbeat_timeout",
        # The monitor's SIGCONT lets the rank run on until its SIGTERM lands.
        resume=None,
    ),
    "hang-ignoring-sigterm": Fault(
        "hang_ignoring_sigterm:1:5:0",
        # Only the monitor's escalation after the grace period can end this rank: the
        # launcher stops ranks only after a failure, and the other rank is healthy.
        rf"{RANK1} was killed by signal SIGKILL; its monitor terminated it: heartbeat_timeout",
    ),
    "hang-exiting-0-on-sigterm": Fault(
        # A rank its monitor terminated failed, whatever its exit code.
        "hang_exiting_0_on_sigterm:1:5:0",
        rf"{RANK1} [^;]+; its monitor terminated it: heartbeat_timeout",
    ),
    "hang-in-section": Fault(
        "hang_in_section:1:5:0",
        rf"{RANK1} [^;]+; its monitor terminated it: section_timeout, section 'step'",
        script_args=("--sections",),
        launcher_args=("--ft-rank-section-timeouts=step:3",),
    ),
    "hang-before-first-heartbeat": Fault(
        "hang:1:0:0",
        rf"{RANK1} [^;]+; its monitor terminated it: initial_heartbeat_timeout",
        # The script connects to its monitor after torch's start-up, so a short
        # initial timeout only has to cover its first heartbeat.
        launcher_args=("--ft-initial-rank-heartbeat-timeout=5",),
        resume=0,
    ),
}


def _check_training(
    journal: list[Event], attempts: int, *, last_record_may_be_lost: bool = False
) -> dict[int, int]:
    resumes = assert_every_step_once(
        journal, STEPS, last_record_may_be_lost=last_record_may_be_lost
    )
    done = [e for e in journal if e["event"] == "done" and e["rank"] == 0]
    assert done[-1]["total"] == EXPECTED_TOTAL, f"final total {done[-1]['total']}"
    started = {e["attempt"] for e in journal if e["event"] == "start"}
    assert started == set(range(attempts)), f"attempts started: {sorted(started)}"
    return resumes


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", list(FAULTS.values()), ids=list(FAULTS))
def test_rank_fault_is_restarted_and_training_resumes(launch: Launch, fault: Fault) -> None:
    script_args = ["--checkpoint-every", str(CHECKPOINT_EVERY), "--fault", fault.spec]
    run = launch([*script_args, *fault.script_args], fault.launcher_args)
    run.expect_exit(0, timeout=150)

    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, f"expected one restart, got {reasons}"
    assert matches(fault.cause, reasons[0]), f"restart cause {reasons[0]!r} !~ {fault.cause!r}"
    journal = run.journal()
    faults = [e for e in journal if e["event"] == "fault"]
    assert [(e["rank"], e["attempt"]) for e in faults] == [(1, 0)]
    # A rank that runs on after its hang (resume None) may die between a step's
    # all-reduce and its journal line; rank 0's final total still checks every step.
    resumes = _check_training(journal, attempts=2, last_record_may_be_lost=fault.resume is None)

    # Checkpoint and resume: attempt 1 starts from attempt 0's last checkpoint, and
    # the steps attempt 0 ran after it run again (counted once above).
    saved = [e["step"] for e in journal if e["event"] == "checkpoint" and e["attempt"] == 0]
    assert resumes[1] >= max(saved, default=0), (resumes, saved)
    assert resumes[1] % CHECKPOINT_EVERY == 0, resumes
    if fault.resume is not None:
        assert resumes == {0: 0, 1: fault.resume}
        fault_step = faults[0]["step"]
        for step in range(fault.resume + 1, fault_step):
            ran = [e["attempt"] for e in journal if e["event"] == "step" and e["step"] == step]
            assert sorted(ran) == [0, 0, 1, 1], f"step {step} ran in attempts {ran}"


@pytest.mark.timeout(240)
def test_two_faults_in_a_row(launch: Launch) -> None:
    run = launch(["--fault", "sigkill:1:4:0", "--fault", "raise:0:8:1"], ["--max-restarts=2"])
    run.expect_exit(0, timeout=210)
    cycles = [c for c in run.cycles() if c.get("action") == "restart"]
    assert [c["cycle"] for c in cycles] == [0, 1]
    assert all(c["charged"] for c in cycles)
    assert matches(rf"{RANK1} was killed by signal SIGKILL", cycles[0]["reason"])
    assert matches(r"rank 0 \(local rank 0, pid \d+\) exited with code 1", cycles[1]["reason"])
    resumes = _check_training(run.journal(), attempts=3)
    assert resumes == {0: 0, 1: 3, 2: 6}


@pytest.mark.timeout(180)
def test_killed_monitor_is_replaced_and_its_rank_restarted(launch: Launch) -> None:
    run = launch(["--step-time", "0.3"])
    # Kill rank 1's monitor once rank 1 trains; 0.3 s steps leave the job far from done.
    run.wait_until(lambda: run.steps_done(attempt=0, rank=1) >= 1, 90, "rank 1 at step 1")
    old = run.monitor_pid(local_rank=1)
    os.kill(old, signal.SIGKILL)
    assert run.steps_done(attempt=0, rank=1) < STEPS, "the job ended before the monitor died"

    def replaced() -> bool:
        try:
            return run.monitor_pid(local_rank=1) != old
        except AssertionError:
            return False

    run.wait_until(replaced, 60, "a new monitor for local rank 1")
    run.expect_exit(0, timeout=150)

    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, reasons
    assert "the monitor of local rank 1 died" in reasons[0]
    _check_training(run.journal(), attempts=2)
