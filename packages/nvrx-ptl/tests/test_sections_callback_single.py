"""FaultToleranceSectionsCallback in single-process Lightning runs against a real monitor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from nvrx.ptl.ft_state import FT_STATE_FILENAME

from .conftest import Monitor, Procs, probes, run_training

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SECTION_CFG = {
    "initial_rank_heartbeat_timeout": None,
    "rank_heartbeat_timeout": None,
    "rank_section_timeouts": {"setup": 300.0, "step": 300.0, "checkpointing": 300.0},
    "rank_out_of_section_timeout": 300.0,
    "safety_factor": 30.0,
}


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "callbacks": ["sections"],
        "ckpt_dir": str(tmp_path / "ckpt"),
        "log_dir": str(tmp_path / "logs"),
        "exp_dir": str(tmp_path / "ft"),
        "max_steps": 40,
        "ckpt_every": 5,
        "val_every": 10,
        "step_sleep": 0.01,
    }
    cfg.update(extra)
    return cfg


def _section_state(tmp_path: Path) -> dict[str, object]:
    state = json.loads((tmp_path / "ft" / FT_STATE_FILENAME).read_text())
    return state["current_timeouts"]["section"]  # type: ignore[no-any-return]


@pytest.mark.timeout(300)
def test_sections_and_their_timeouts_over_two_jobs(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    cfg = _cfg(tmp_path, stop_after_steps=20)

    rc, out = run_training(procs, cfg, monitor.env)
    assert rc == 0, out
    assert [p["open"] for p in probes(out, "model_setup")] == [["setup"]]
    assert {tuple(p["open"]) for p in probes(out, "training_step")} == {("step",)}  # type: ignore[arg-type]
    assert [p["open"] for p in probes(out, "after_step")] == [[]]
    saves = probes(out, "save_checkpoint")
    assert saves, out
    assert {tuple(p["open"]) for p in saves} == {("checkpointing",)}  # type: ignore[arg-type]
    first = _section_state(tmp_path)
    assert sorted(first["calculated_sections"]) == ["checkpointing", "step"]  # type: ignore[call-overload]
    assert first["is_out_of_section_calculated"] is False
    assert "Can't update the setup section timeout until a checkpoint was loaded" in out

    rc, out = run_training(procs, cfg, monitor.env)
    assert rc == 0, out
    assert "Fault tolerance timeouts loaded" in out
    second = _section_state(tmp_path)
    assert sorted(second["calculated_sections"]) == ["checkpointing", "setup", "step"]  # type: ignore[call-overload]
    assert second["is_out_of_section_calculated"] is True
    timeouts = second["section"]
    assert all(0 < v < 300.0 for v in timeouts.values()), timeouts  # type: ignore[attr-defined]
    assert not [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]


@pytest.mark.timeout(200)
def test_exception_closes_sections_and_applies_the_policy(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    flag = tmp_path / "finished.flag"
    cfg = _cfg(tmp_path, raise_at_step=3, policy=True, autoresume=True)
    env = {**monitor.env, "FAULT_TOL_FINISHED_FLAG_FILE": str(flag)}
    rc, out = run_training(procs, cfg, env)
    assert rc == 1, out
    assert "injected failure at step 3" in out
    at_raise = [p for p in probes(out, "training_step") if p["step"] == 3]
    assert at_raise
    assert at_raise[0]["open"] == ["step"]
    exc = probes(out, "exception")
    assert len(exc) == 1
    assert exc[0]["open"] == [], "the step section must be closed when the exception leaves it"
    assert "Rank exits due to a failure, won't update the FT timeouts" in out
    assert flag.exists(), "ShutdownWorkload with autoresume creates the finished flag"
    control = [e for e in monitor.events_seen() if e["event"] == "workload_control"]
    assert control
    assert control[0]["action"] == "ShutdownWorkload"


@pytest.mark.timeout(200)
def test_config_without_the_three_sections_is_rejected(
    tmp_path: Path, procs: Procs, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(rank_section_timeouts={"step": 10.0})
    rc, out = run_training(procs, _cfg(tmp_path), monitor.env)
    assert rc != 0
    assert "rank_section_timeouts must have exactly the sections" in out
    assert "got ['step']" in out
