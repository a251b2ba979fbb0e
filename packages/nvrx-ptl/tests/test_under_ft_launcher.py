"""The FT callbacks under a real ft_launcher: 2 DDP ranks on gloo, real monitors, restarts.

They need ``ft_launcher``: nvrx-ptl depends on nvrx-ft-launcher, so it is there
wherever nvrx-ptl was installed with its dependencies (skipped otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from nvrx.ptl.ft_state import HEARTBEAT_STATE_FILENAME

from .conftest import Procs, probes, results, run_ft_launcher

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("nvrx.launcher") is None,
        reason="needs nvrx-ft-launcher (ft_launcher)",
    ),
]


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "callbacks": ["ft"],
        "ckpt_dir": str(tmp_path / "ckpt"),
        "log_dir": str(tmp_path / "logs"),
        "exp_dir": str(tmp_path / "ft"),
        "ckpt_every": 4,
        "val_every": 8,
        "step_sleep": 0.03,
    }
    cfg.update(extra)
    return cfg


@pytest.mark.timeout(400)
def test_hung_rank_is_detected_restarted_and_training_finishes(
    tmp_path: Path, procs: Procs
) -> None:
    flag = tmp_path / "finished.flag"
    cfg = _cfg(
        tmp_path,
        autoresume=True,
        max_steps=150,
        ckpt_every=10,
        val_every=30,
        simulated_fault={"fault_type": "rank_hung", "base_delay": 2.0, "rank_to_fail": 1},
    )
    launcher_args = [
        "--max-restarts=2",
        "--ft-initial-rank-heartbeat-timeout=120",
        "--ft-rank-heartbeat-timeout=6",  # generous: a loaded 2-core box stalls at times
        "--ft-rank-termination-grace-period=2",
    ]
    rc, out = run_ft_launcher(
        procs, cfg, launcher_args, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    )
    assert rc == 0, out
    assert "Simulated fault rank_hung will hit this rank" in out
    # the monitor saw the heartbeats stop, and the launcher restarted the job for it
    assert re.search(r"terminating rank 1 \(pid \d+\): heartbeat_timeout", out), out
    assert re.search(r"restart 1/2.*rank 1 .*heartbeat_timeout", out), out
    attempts = {p["attempt"] for p in probes(out, "model_setup")}
    assert attempts == {0, 1}, f"exactly one restart expected, saw attempts {attempts}\n{out}"
    final = results(out)
    assert {r: (v["attempt"], v["global_step"]) for r, v in final.items()} == {
        0: (1, 150),
        1: (1, 150),
    }, out
    assert flag.exists(), "the finished flag must exist once training completed"


@pytest.mark.timeout(500)
def test_timeouts_over_three_jobs_and_finished_flag(tmp_path: Path, procs: Procs) -> None:
    flag = tmp_path / "finished.flag"
    env = {"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    cfg = _cfg(tmp_path, autoresume=True, max_steps=12, stop_after_steps=4, setup_sleep=0.5)
    launcher_args = [
        "--max-restarts=0",
        "--ft-initial-rank-heartbeat-timeout=300",
        "--ft-rank-heartbeat-timeout=300",
        "--ft-safety-factor=30",
    ]
    state_path = tmp_path / "ft" / HEARTBEAT_STATE_FILENAME

    rc, out = run_ft_launcher(procs, cfg, launcher_args, env=env)
    assert rc == 0, out
    assert {v["global_step"] for v in results(out).values()} == {4}
    assert not flag.exists()
    assert not state_path.exists() or json.loads(state_path.read_text())["current_timeouts"] == {}

    rc, out = run_ft_launcher(procs, cfg, launcher_args, env=env)
    assert rc == 0, out
    assert not flag.exists()
    hb = json.loads(state_path.read_text())["current_timeouts"]["heartbeat"]
    assert hb["were_calculated"] is True
    assert hb["initial"] >= 30 * 0.5, "the initial timeout covers the gap before the first beat"

    rc, out = run_ft_launcher(procs, cfg, launcher_args, env=env)
    assert rc == 0, out
    loaded = probes(out, "hb_timeouts")
    assert len(loaded) == 2, "both ranks start with the loaded timeouts"
    assert all(f"initial={hb['initial']:.2f}" in str(p["timeouts"]) for p in loaded), loaded
    assert {v["global_step"] for v in results(out).values()} == {12}
    assert flag.exists()


@pytest.mark.timeout(300)
def test_sections_exception_policy_shuts_the_workload_down(tmp_path: Path, procs: Procs) -> None:
    flag = tmp_path / "finished.flag"
    cfg = _cfg(
        tmp_path,
        callbacks=["sections"],
        max_steps=40,
        raise_at_step=3,
        policy=True,
        autoresume=True,
    )
    launcher_args = [
        "--max-restarts=3",
        "--ft-initial-rank-heartbeat-timeout=none",
        "--ft-rank-heartbeat-timeout=none",
        "--ft-rank-section-timeouts=setup:300,step:300,checkpointing:300",
        "--ft-rank-out-of-section-timeout=300",
    ]
    rc, out = run_ft_launcher(
        procs, cfg, launcher_args, env={"FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    )
    assert rc == 4, f"ShutdownWorkload must end the job without restarts (exit 4), got {rc}\n{out}"
    assert {p["attempt"] for p in probes(out, "model_setup")} == {0}
    exceptions = probes(out, "exception")
    assert exceptions
    assert all(p["open"] == [] for p in exceptions), exceptions
    assert flag.exists()


@pytest.mark.timeout(300)
def test_straggler_reports_reach_the_launchers_journal_and_goodput(
    tmp_path: Path, procs: Procs
) -> None:
    """Rank 0's real Detector reports go to ft_launcher: journaled, worst rank named."""
    journal = tmp_path / "journal.jsonl"
    cfg = _cfg(
        tmp_path,
        callbacks=["straggler"],
        max_steps=150,
        ckpt_every=1000,
        step_sleep=0.01,
        slow_rank=1,
        slow_sleep=0.04,
        straggler={"report_time_interval": 1.0, "num_gpu_perf_scores_to_print": 0},
    )
    rc, out = run_ft_launcher(procs, cfg, ["--max-restarts=0", f"--ft-journal={journal}"])
    assert rc == 0, out
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    reports = [r for r in records if r["event"] == "straggler_report"]
    assert reports, out
    assert not [r for r in records if r["event"] == "straggler_report_ignored"]
    for report in reports:
        assert report["ranks"] == 2
        assert report["forward_section"] == "DDPStrategy.training_step"
        assert report["step_section"] == "train_step"
        assert report["worst_rank"] == 1, report  # its forward pass sleeps 40 ms more
        assert report["worst_score"] < 0.7, report
        # forward ~12 and ~52 ms (median 32), steps ~60 ms: (52 - 32) / 60 ~ 0.33, the
        # mean share of a step the two ranks wait (rank 0 ~40 of 60 ms, rank 1 none)
        assert 0.15 < report["wait_fraction"] < 0.5, report
        assert report["window_start"] < report["window_end"], report
    [summary] = [r["summary"] for r in records if r["event"] == "job_goodput"]
    seconds = summary["seconds"]
    assert 0.1 * seconds["productive"] < seconds["straggler_wait"] < seconds["productive"]
