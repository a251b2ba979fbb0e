"""The Lightning stack under ft_launcher: nvrx.ptl callbacks, resume, and a damaged FT state.

``scripts/lightning_steps.py`` trains a tiny model with FaultToleranceCallback
(calculate_timeouts=True), StragglerDetectionCallback and ModelCheckpoint on 2 ranks
(DDP, gloo). The FT state file left by an earlier job is damaged: every job must say
so clearly, fall back to the timeouts of the launcher's FT config, and lose nothing:
training still completes every step exactly once, and a job that can calculate
timeouts replaces the damaged file with a valid one.
"""

from __future__ import annotations

import json
import pathlib

import pytest
from conftest import Launch
from itest_harness import LIGHTNING_STEPS, assert_every_step_once, matches, restart_reasons

from nvrx.ptl.ft_state import FT_STATE_FILENAME, load_ft_state

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

MAX_STEPS = 8
FT_ARGS = ("--ft-initial-rank-heartbeat-timeout=60", "--ft-rank-heartbeat-timeout=15")
CONFIG_TIMEOUTS = {"initial": 60.0, "subsequent": 15.0, "were_calculated": False}
VALID_STATE = {"current_timeouts": {"heartbeat": {"initial": 30.0, "subsequent": 9.0}}}

DAMAGED = {
    # A state file cut short (the job that wrote it died mid-write), then a rank killed.
    "truncated-then-rank-killed": (json.dumps(VALID_STATE)[:40], "sigkill:1:5:0"),
    # Not an FT state at all (edited by hand, disk trouble); no fault in this job.
    "garbage": ("\x00\x13not json at all\n", None),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("state_text", "fault"), list(DAMAGED.values()), ids=list(DAMAGED))
def test_damaged_ft_state_falls_back_to_config_timeouts(
    launch: Launch, out_dir: pathlib.Path, state_text: str, fault: str | None
) -> None:
    state_file = out_dir / "ft_state" / FT_STATE_FILENAME
    state_file.parent.mkdir()
    state_file.write_text(state_text)
    script_args = ["--max-steps", str(MAX_STEPS), "--checkpoint-every", "2"]
    if fault is not None:
        script_args += ["--fault", fault]
    run = launch(script_args, FT_ARGS, script=LIGHTNING_STEPS)
    run.expect_exit(0, timeout=210)

    attempts = 2 if fault else 1
    log = run.log()
    warnings = [line for line in log.splitlines() if "Ignoring the FT state file" in line]
    assert len(warnings) == attempts, warnings
    assert matches(r"corrupt or truncated|not an FT state", warnings[0]), warnings[0]
    assert str(state_file) in warnings[0]
    journal = run.journal()
    resumes = [e for e in journal if e["event"] == "resume"]
    assert len(resumes) == 2 * attempts
    for resume in resumes:
        assert resume["hb_timeouts"] == CONFIG_TIMEOUTS, resume

    found = assert_every_step_once(journal, MAX_STEPS)
    reasons = restart_reasons(run.cycles())
    if fault is None:
        assert reasons == []
        # The first job loads no checkpoint, so it calculates nothing: the file stays.
        assert state_file.read_text() == state_text
        return
    assert len(reasons) == 1, reasons
    assert matches(r"rank 1 \(local rank 1, pid \d+\) was killed by signal SIGKILL", reasons[0])
    assert found == {0: 0, 1: 4}, f"resume points {found}"
    # The resumed job loaded and saved checkpoints: it calculated timeouts and
    # replaced the damaged file atomically with a valid state.
    state = load_ft_state(state_file)
    assert state is not None
    assert state["current_timeouts"]["heartbeat"]["were_calculated"] is True


@pytest.mark.timeout(240)
def test_lightning_job_restarts_through_warm_spares(launch: Launch) -> None:
    # The restarted ranks are spares that imported torch and Lightning while attempt 0
    # trained; the script then runs in them as __main__ and resumes from its checkpoint.
    script_args = ["--max-steps", str(MAX_STEPS), "--checkpoint-every", "2"]
    run = launch(
        [*script_args, "--fault", "sigkill:1:5:0"],
        [*FT_ARGS, "--warm-spares", "--warm-spare-preload=torch,lightning"],
        script=LIGHTNING_STEPS,
    )
    run.expect_exit(0, timeout=210)
    assert "local ranks [0, 1] started from warm spares" in run.log()
    reasons = restart_reasons(run.cycles())
    assert len(reasons) == 1, reasons
    assert matches(r"rank 1 \(local rank 1, pid \d+\) was killed by signal SIGKILL", reasons[0])
    found = assert_every_step_once(run.journal(), MAX_STEPS)
    assert found == {0: 0, 1: 4}, f"resume points {found}"
