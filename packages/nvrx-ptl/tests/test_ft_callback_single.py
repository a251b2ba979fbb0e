"""FaultToleranceCallback in single-process Lightning runs against a real rank monitor."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from nvrx.ft import RankMonitorClientError
from nvrx.ptl import FaultToleranceCallback
from nvrx.ptl.ft_state import HEARTBEAT_STATE_FILENAME

from .conftest import Monitor, Procs, run_training, tiny_fit

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
    path = tmp_path / "ft" / HEARTBEAT_STATE_FILENAME
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.timeout(120)
def test_single_process_calculates_and_saves_timeouts_in_the_second_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    """No torch.distributed at all: FT still works, and rank 0 (the only one) writes."""
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(flag))
    exp_dir, ckpt_dir = tmp_path / "ft", tmp_path / "ckpt"

    def job(max_steps: int, resume: bool) -> FaultToleranceCallback:
        callback = FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=exp_dir)
        ckpt = str(ckpt_dir / "last.ckpt") if resume else None
        tiny_fit(tmp_path, [callback], max_steps=max_steps, ckpt_path=ckpt, ckpt_dir=ckpt_dir)
        return callback

    first = job(max_steps=4, resume=False)
    assert first.state_machine.num_tr_iters_total == 4
    assert not first.state_machine.timeouts_updated, "no checkpoint was loaded"
    assert (_state(tmp_path) or {}).get("current_timeouts", {}) == {}
    flag.unlink()  # max_steps=4 completed "that" training; the next one goes on to 8

    second = job(max_steps=8, resume=True)
    assert second.state_machine.loaded_checkpoint
    assert second.state_machine.timeouts_updated
    state = _state(tmp_path)
    assert state is not None
    hb = state["current_timeouts"]["heartbeat"]  # type: ignore[index]
    assert hb["were_calculated"] is True
    assert 0 < hb["subsequent"] < ROBUST_TIMEOUTS["rank_heartbeat_timeout"]
    assert flag.exists(), "the finished flag must appear when max_steps is reached"
    assert not [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]


@pytest.mark.timeout(120)
def test_clean_stop_sys_exit_0_calculates_timeouts_without_finishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    """A preempted job (sys.exit(0)) is not a failure, but it is not the end of training."""
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(flag))
    exp_dir, ckpt_dir = tmp_path / "ft", tmp_path / "ckpt"

    class Preempt(pl.Callback):
        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 7:
                sys.exit(0)

    first = FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=exp_dir)
    tiny_fit(tmp_path, [first], max_steps=4, ckpt_dir=ckpt_dir)
    flag.unlink()
    second = FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=exp_dir)
    with pytest.raises(SystemExit):
        tiny_fit(
            tmp_path,
            [second, Preempt()],
            max_steps=100,
            ckpt_path=str(ckpt_dir / "last.ckpt"),
            ckpt_dir=ckpt_dir,
        )
    assert second.state_machine.is_stop_exception
    assert second.state_machine.timeouts_updated
    assert _state(tmp_path)["current_timeouts"]["heartbeat"]["were_calculated"] is True  # type: ignore[index]
    assert not flag.exists(), "a preempted job did not complete the training"
    assert not second.is_initialized


@pytest.mark.timeout(120)
def test_without_a_monitor_setup_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVRX_FT_MONITOR_SOCKET", raising=False)
    callback = FaultToleranceCallback(autoresume=False, calculate_timeouts=True)
    with pytest.raises(
        RankMonitorClientError, match=r"NVRX_FT_MONITOR_SOCKET is not set.*ft_launcher"
    ):
        tiny_fit(tmp_path, [callback])
    assert not callback.is_initialized


@pytest.mark.timeout(120)
def test_autoresume_needs_the_flag_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    monkeypatch.delenv("FAULT_TOL_FINISHED_FLAG_FILE", raising=False)
    callback = FaultToleranceCallback(autoresume=True, calculate_timeouts=True)
    with pytest.raises(RuntimeError, match="FAULT_TOL_FINISHED_FLAG_FILE"):
        tiny_fit(tmp_path, [callback])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("content", "expected_log", "expected_timeouts"),
    [
        (
            '{"current_timeouts": {"heartbeat": {"ini',
            r"Ignoring the FT state file .*not valid JSON",
            "initial=300.00, subsequent=300.00, were_calculated=False",
        ),
        (
            '{"current_timeouts": {"heartbeat": {"initial": -1, "subsequent": 2}}}',
            r"Ignoring the FT state file .*initial is -1: must be finite, > 0",
            "initial=300.00, subsequent=300.00, were_calculated=False",
        ),
        (
            '{"current_timeouts": {"heartbeat": {"initial": Infinity, "subsequent": NaN}}}',
            r"Ignoring the FT state file .*Infinity, which is not a number of seconds",
            "initial=300.00, subsequent=300.00, were_calculated=False",
        ),
        (
            '{"current_timeouts": {"heartbeat": ["initial", 5]}}',
            r"Ignoring the FT state file .*heartbeat is a list, not a mapping",
            "initial=300.00, subsequent=300.00, were_calculated=False",
        ),
        (  # NVRx 0.1/0.2's flat shape
            '{"current_timeouts": {"initial": 70.5, "subsequent": 41.0, "were_calculated": true}}',
            r"Fault tolerance timeouts loaded from",
            "initial=70.50, subsequent=41.00, were_calculated=True",
        ),
        (
            json.dumps(
                {
                    "current_timeouts": {
                        "heartbeat": {"initial": 77.5, "subsequent": 42.25, "were_calculated": True}
                    }
                }
            ),
            r"Fault tolerance timeouts loaded from",
            "initial=77.50, subsequent=42.25, were_calculated=True",
        ),
    ],
)
def test_state_file_is_loaded_or_ignored_clearly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
    content: str,
    expected_log: str,
    expected_timeouts: str,
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    exp_dir = tmp_path / "ft"
    exp_dir.mkdir()
    (exp_dir / HEARTBEAT_STATE_FILENAME).write_text(content)
    callback = FaultToleranceCallback(
        autoresume=False, calculate_timeouts=True, exp_dir=exp_dir, logger_name="test.ft"
    )
    seen: list[object] = []
    callback.on_train_start = lambda *a: seen.append(  # type: ignore[method-assign]
        callback.fault_tol_client.hb_timeouts  # type: ignore[union-attr]
    )
    with caplog.at_level(logging.INFO, logger="test.ft"):
        tiny_fit(tmp_path, [callback], max_steps=3)
    assert re.search(expected_log, caplog.text), caplog.text
    assert expected_timeouts in str(seen[0])
    assert not callback.is_initialized, "FT shuts down at the end of fit"


@pytest.mark.timeout(120)
def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match="autoresume"):
        FaultToleranceCallback(autoresume="yes", calculate_timeouts=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fault_type"):
        FaultToleranceCallback(
            autoresume=False,
            calculate_timeouts=False,
            simulated_fault_params={"fault_type": "boom", "base_delay": 1},
        )


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
    # The monitor's SIGTERM either kills the rank or, when Lightning's own SIGTERM
    # handler gets there first, ends fit early; both end the hung run.
    assert rc < 0 or "Received SIGTERM" in out, f"the hung rank was not terminated ({rc}):\n{out}"
    assert "Simulated fault rank_hung will hit this rank" in out
    terminated = [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]
    assert terminated, out
    assert terminated[0]["cause"] == "heartbeat_timeout"


@pytest.mark.timeout(120)
def test_both_ft_callbacks_together_are_rejected(tmp_path: Path) -> None:
    from nvrx.ptl import FaultToleranceSectionsCallback

    heartbeats = FaultToleranceCallback(autoresume=False, calculate_timeouts=True)
    sections = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=True)
    with pytest.raises(ValueError, match="cannot be used together with"):
        tiny_fit(tmp_path, [heartbeats, sections])
    assert not heartbeats.is_initialized
    assert not sections.is_initialized


@pytest.mark.timeout(120)
def test_default_dir_inside_a_logger_version_is_flagged(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
) -> None:
    from lightning.pytorch.loggers import CSVLogger

    monitor = make_monitor(**ROBUST_TIMEOUTS)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    callback = FaultToleranceCallback(
        autoresume=False, calculate_timeouts=True, logger_name="test.ft.dir"
    )
    with caplog.at_level(logging.INFO, logger="test.ft.dir"):
        tiny_fit(tmp_path, [callback], max_steps=2, logger=CSVLogger(tmp_path, name="csv"))
    assert (tmp_path / "csv" / "version_0" / "ft_state").is_dir()
    assert "will not find the calculated timeouts. Pass exp_dir=" in caplog.text


@pytest.mark.timeout(120)
def test_a_failed_timeouts_update_never_fails_the_job(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
) -> None:
    monitor = make_monitor(**ROBUST_TIMEOUTS)
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(flag))
    exp_dir, ckpt_dir = tmp_path / "ft", tmp_path / "ckpt"

    class BlockStateFile(pl.Callback):
        def on_train_start(self, *args: Any) -> None:
            (exp_dir / HEARTBEAT_STATE_FILENAME).mkdir()  # the state file cannot be written now

    first = FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=exp_dir)
    tiny_fit(tmp_path, [first], max_steps=4, ckpt_dir=ckpt_dir)
    flag.unlink()
    second = FaultToleranceCallback(
        autoresume=True, calculate_timeouts=True, exp_dir=exp_dir, logger_name="test.ft.fail"
    )
    with caplog.at_level(logging.INFO, logger="test.ft.fail"):
        tiny_fit(
            tmp_path,
            [second, BlockStateFile()],
            max_steps=8,
            ckpt_path=str(ckpt_dir / "last.ckpt"),
            ckpt_dir=ckpt_dir,
        )
    assert "FT timeouts not updated: IsADirectoryError" in caplog.text, caplog.text
    assert flag.exists(), "training completed: the flag is there despite the failed update"
    assert not second.is_initialized, "FT was shut down all the same"


@pytest.mark.timeout(120)
def test_learned_timeouts_become_active_after_a_save_in_the_first_job(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_monitor: Callable[..., Monitor],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """calculate_timeouts=True learns within the job: once the steps and a first save
    (the trainer has a checkpoint callback) were seen, the heartbeat timeout tightens."""
    monitor = make_monitor(**ROBUST_TIMEOUTS, learn_min_steps=3)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    callback = FaultToleranceCallback(
        autoresume=False, calculate_timeouts=True, exp_dir=tmp_path / "ft"
    )
    with caplog.at_level(logging.INFO, logger="nvrx.ft.RankMonitorClient"):
        tiny_fit(tmp_path, [callback], max_steps=10, ckpt_dir=tmp_path / "ckpt", step_s=0.02)
    text = caplog.text
    assert "learning timeouts: active after 3 steps and a first checkpoint" in text
    assert "learned timeouts active after" in text
    active = next(r.getMessage() for r in caplog.records if "timeouts active after" in r.message)
    assert "a checkpoint" in active
    assert not [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]
