"""FaultToleranceCallback in single-process Lightning runs against a real rank monitor."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from nvrx.ptl.ft_state import FT_STATE_FILENAME

from .conftest import Monitor, Procs, probes, run_training

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROBUST_TIMEOUTS = {
    "initial_rank_heartbeat_timeout": 300.0,
    "rank_heartbeat_timeout": 300.0,
    "safety_factor": 30.0,  # calculated timeouts stay far above any hiccup of a loaded box
}


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "callbacks": ["ft"],
        "ckpt_dir": str(tmp_path / "ckpt"),
        "log_dir": str(tmp_path / "logs"),
        "exp_dir": str(tmp_path / "ft"),
        "max_steps": 12,
        "ckpt_every": 2,
        "step_sleep": 0.02,
    }
    cfg.update(extra)
    return cfg


def _state(tmp_path: Path) -> dict[str, object] | None:
    path = tmp_path / "ft" / FT_STATE_FILENAME
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.timeout(400)
def test_timeouts_calculated_by_second_job_loaded_by_third_and_flag_at_end(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    flag = tmp_path / "finished.flag"
    env = {**monitor.env, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    cfg = _cfg(tmp_path, autoresume=True, stop_after_steps=4)

    rc, out = run_training(procs, cfg, env)
    assert rc == 0, out
    assert json.loads(out.split("RESULT ")[1].splitlines()[0])["global_step"] == 4
    assert not flag.exists(), "training is not complete after the first job"
    assert (_state(tmp_path) or {}).get("current_timeouts", {}) == {}, out
    assert "FT timeouts not updated in this job" in out

    rc, out = run_training(procs, cfg, env)
    assert rc == 0, out
    assert not flag.exists()
    state = _state(tmp_path)
    assert state is not None, out
    hb = state["current_timeouts"]["heartbeat"]  # type: ignore[index]
    assert hb["were_calculated"] is True
    assert 0 < hb["subsequent"] < ROBUST_TIMEOUTS["rank_heartbeat_timeout"]
    assert "Updated FT timeouts" in out

    rc, out = run_training(procs, cfg, env)
    assert rc == 0, out
    assert "Fault tolerance timeouts loaded" in out
    seen = probes(out, "hb_timeouts")[0]["timeouts"]
    assert f"subsequent={hb['subsequent']:.2f}" in str(seen)
    assert "were_calculated=True" in str(seen)
    assert flag.exists(), "the finished flag must appear when max_steps is reached"
    assert json.loads(out.split("RESULT ")[1].splitlines()[0])["global_step"] == 12
    assert not [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]


@pytest.mark.timeout(200)
def test_without_a_monitor_setup_fails_clearly(tmp_path: Path, procs: Procs) -> None:
    rc, out = run_training(procs, _cfg(tmp_path), {"NVRX_FT_MONITOR_SOCKET": ""})
    assert rc != 0
    assert "NVRX_FT_MONITOR_SOCKET is not set" in out
    assert "ft_launcher" in out


@pytest.mark.timeout(200)
def test_autoresume_needs_the_flag_variable(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    env = {**monitor.env, "FAULT_TOL_FINISHED_FLAG_FILE": ""}
    rc, out = run_training(procs, _cfg(tmp_path, autoresume=True), env)
    assert rc != 0
    assert "FAULT_TOL_FINISHED_FLAG_FILE" in out


@pytest.mark.timeout(200)
def test_corrupt_state_file_falls_back_to_config(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    (tmp_path / "ft").mkdir()
    (tmp_path / "ft" / FT_STATE_FILENAME).write_text('{"current_timeouts": {"heartbeat": {"ini')
    rc, out = run_training(procs, _cfg(tmp_path, max_steps=3), monitor.env)
    assert rc == 0, out
    assert re.search(r"Ignoring the FT state file .*not valid JSON", out), out
    assert "initial=300.00" in probes(out, "hb_timeouts")[0]["timeouts"]  # type: ignore[operator]


@pytest.mark.timeout(200)
def test_simulated_hang_is_detected_by_the_monitor(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(
        initial_rank_heartbeat_timeout=120.0,
        rank_heartbeat_timeout=3.0,
        rank_termination_grace_period=2.0,
    )
    fault = {"fault_type": "rank_hung", "base_delay": 2.0, "rank_to_fail": 0}
    cfg = _cfg(tmp_path, max_steps=100000, step_sleep=0.05, simulated_fault=fault)
    rc, out = run_training(procs, cfg, monitor.env)
    assert rc < 0, f"the hung rank must be terminated by a signal, got {rc}:\n{out}"
    assert "Simulated fault rank_hung will hit this rank" in out
    terminated = [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]
    assert terminated, out
    assert terminated[0]["cause"] == "heartbeat_timeout"
