"""FaultToleranceSectionsCallback in single-process Lightning fits against a real monitor."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest

from nvrx.ft import WorkloadAction, WorkloadControlRequest
from nvrx.ptl import FaultToleranceSectionsCallback
from nvrx.ptl.ft_state import SECTIONS_STATE_FILENAME

from .conftest import Monitor, tiny_fit

pytestmark = [pytest.mark.multiprocess]

SECTION_CFG = {
    "initial_rank_heartbeat_timeout": None,
    "rank_heartbeat_timeout": None,
    "rank_section_timeouts": {"setup": 300.0, "step": 300.0, "checkpointing": 300.0},
    "rank_out_of_section_timeout": 300.0,
    "safety_factor": 30.0,
}


class SectionProbe(pl.Callback):
    """Records which FT sections are open at hooks that run inside and outside them."""

    def __init__(self, raise_in_backward_at: int | None = None) -> None:
        self.seen: dict[str, set[tuple[str, ...]]] = {}
        self.raise_in_backward_at = raise_in_backward_at
        self.ft: FaultToleranceSectionsCallback | None = None

    def _record(self, trainer: pl.Trainer, hook: str) -> None:
        if self.ft is None:
            callbacks: list[pl.Callback] = trainer.callbacks  # type: ignore[attr-defined]
            self.ft = next(c for c in callbacks if isinstance(c, FaultToleranceSectionsCallback))
        client = self.ft.fault_tol_client
        calc = client.timeouts_calc if client is not None else None
        opened = tuple(sorted(calc.open_sections)) if calc is not None else ("<no client>",)
        self.seen.setdefault(hook, set()).add(opened)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._record(trainer, "setup")  # runs after the FT callback's setup

    def on_before_backward(self, trainer: pl.Trainer, *args: Any) -> None:
        self._record(trainer, "backward")
        if trainer.global_step == self.raise_in_backward_at:
            raise RuntimeError(f"injected failure at step {trainer.global_step}")

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
        self._record(trainer, "optimizer_step")

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self._record(trainer, "batch_end")

    def on_save_checkpoint(self, trainer: pl.Trainer, *args: Any) -> None:
        self._record(trainer, "save_checkpoint")

    def on_exception(self, trainer: pl.Trainer, *args: Any) -> None:
        self._record(trainer, "exception")  # runs before the FT callback's on_exception


def _section_state(exp_dir: Path) -> dict[str, Any]:
    state = json.loads((exp_dir / SECTIONS_STATE_FILENAME).read_text())
    return state["current_timeouts"]["section"]  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_sections_and_their_timeouts_over_two_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    exp_dir, ckpt_dir = tmp_path / "ft", tmp_path / "ckpt"

    def job(max_steps: int, resume: bool) -> SectionProbe:
        probe = SectionProbe()
        ft = FaultToleranceSectionsCallback(
            autoresume=False, calculate_timeouts=True, exp_dir=exp_dir
        )
        ckpt = str(ckpt_dir / "last.ckpt") if resume else None
        trainer: Any = tiny_fit(
            tmp_path, [ft, probe], max_steps=max_steps, ckpt_path=ckpt, ckpt_dir=ckpt_dir
        )
        assert not ft.is_initialized
        left = set(vars(trainer.strategy)) & {"training_step", "backward", "save_checkpoint"}
        assert not left, "the strategy is left as it was"
        assert "save_checkpoint" not in vars(trainer)
        return probe

    probe = job(max_steps=20, resume=False)
    assert probe.seen["setup"] == {("setup",)}
    assert probe.seen["backward"] == {("step",)}, "backward is part of the step"
    assert probe.seen["optimizer_step"] == {("step",)}, "so is the optimizer step"
    assert probe.seen["batch_end"] == {()}
    assert probe.seen["save_checkpoint"] == {("checkpointing",)}
    first = _section_state(exp_dir)
    assert sorted(first["calculated_sections"]) == ["checkpointing", "step"]
    # Learned within the job (NVRx calculates it only at the end of a job that saw
    # all three sections; learn_timeouts: false keeps that).
    assert first["is_out_of_section_calculated"] is True

    job(max_steps=40, resume=True)
    second = _section_state(exp_dir)
    assert sorted(second["calculated_sections"]) == ["checkpointing", "setup", "step"]
    assert second["is_out_of_section_calculated"] is True
    assert all(0 < v < 300.0 for v in second["section"].values()), second
    assert not [e for e in monitor.events_seen() if e["event"] == "rank_terminated"]


@pytest.mark.timeout(120)
def test_exception_closes_sections_and_applies_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    flag = tmp_path / "finished.flag"
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    monkeypatch.setenv("FAULT_TOL_FINISHED_FLAG_FILE", str(flag))
    seen: list[BaseException] = []

    def policy(exc: BaseException) -> WorkloadControlRequest:
        seen.append(exc)
        return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, "cannot recover")

    probe = SectionProbe(raise_in_backward_at=3)
    ft = FaultToleranceSectionsCallback(
        autoresume=True,
        calculate_timeouts=True,
        exp_dir=tmp_path / "ft",
        exc_handling_policy=policy,
    )
    with pytest.raises(RuntimeError, match="injected failure at step 3"):
        tiny_fit(tmp_path, [probe, ft], max_steps=10)
    assert probe.seen["exception"] == {()}, "the step section closed when the exception left it"
    assert [str(e) for e in seen] == ["injected failure at step 3"]
    assert flag.exists(), "ShutdownWorkload with autoresume creates the finished flag"
    control = [e for e in monitor.events_seen() if e["event"] == "workload_control"]
    assert [e["action"] for e in control] == ["ShutdownWorkload"]
    assert not ft.is_initialized
    assert not (tmp_path / "ft" / SECTIONS_STATE_FILENAME).exists(), (
        "a failed job writes no timeouts"
    )


@pytest.mark.timeout(120)
def test_config_without_the_three_sections_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(rank_section_timeouts={"step": 10.0})
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    callback = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False)
    with pytest.raises(ValueError, match=r"exactly the sections .*got \['step'\]"):
        tiny_fit(tmp_path, [callback])
    assert not callback.is_initialized


def test_policy_must_be_callable() -> None:
    with pytest.raises(ValueError, match="exc_handling_policy"):
        FaultToleranceSectionsCallback(
            autoresume=False,
            calculate_timeouts=False,
            exc_handling_policy="exclude",  # type: ignore[arg-type]
        )


@pytest.mark.timeout(120)
def test_sections_and_straggler_callbacks_together(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
) -> None:
    from nvrx.ptl import StragglerDetectionCallback

    monitor = make_monitor(**SECTION_CFG)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    probe = SectionProbe()
    ft = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False)
    straggler = StragglerDetectionCallback(report_time_interval=0.1, logger_name="test.both")
    with caplog.at_level(logging.INFO, logger="test.both"):
        tiny_fit(tmp_path, [ft, straggler, probe], max_steps=300, step_s=0.002)  # >= 0.6 s
    assert probe.seen["backward"] == {("step",)}
    assert "Section 'SingleDeviceStrategy.training_step' relative performance" in caplog.text
    assert not ft.is_initialized
    assert not straggler.initialized


@pytest.mark.timeout(120)
def test_nvrx_sections_state_file_carries_over(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
) -> None:
    """``_ft_state_.json`` as NVRx's sections callback wrote it: its section timeouts apply;
    heartbeat timeouts (which this callback never sends heartbeats for) are not loaded."""
    monitor = make_monitor(**SECTION_CFG)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    exp_dir = tmp_path / "ft"
    exp_dir.mkdir()
    nvrx_state = {
        "current_timeouts": {
            "heartbeat": {"initial": 40.0, "subsequent": 35.0, "were_calculated": True},
            "section": {
                "section": {"setup": 250.5, "step": 120.25, "checkpointing": 300.0},
                "out_of_section": 200.0,
                "calculated_sections": ["setup", "step"],
                "is_out_of_section_calculated": True,
            },
        }
    }
    assert FaultToleranceSectionsCallback.TIMEOUTS_FILENAME == "_ft_state_.json"
    (exp_dir / "_ft_state_.json").write_text(json.dumps(nvrx_state))
    ft = FaultToleranceSectionsCallback(
        autoresume=False, calculate_timeouts=True, exp_dir=exp_dir, logger_name="test.carry"
    )
    seen: list[Any] = []

    class Look(pl.Callback):
        def on_train_start(self, *args: Any) -> None:
            client = ft.fault_tol_client
            assert client is not None
            seen.append((client.section_timeouts, client.hb_timeouts))

    with caplog.at_level(logging.INFO, logger="test.carry"):
        tiny_fit(tmp_path, [ft, Look()], max_steps=2)
    assert "Fault tolerance timeouts loaded from" in caplog.text, caplog.text
    sections, heartbeats = seen[0]
    assert sections.section["setup"] == pytest.approx(250.5)
    assert sections.section["step"] == pytest.approx(120.25)
    assert sections.out_of_section == pytest.approx(200.0)
    assert heartbeats is None or not heartbeats.were_calculated, heartbeats


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "content",
    [
        '{"current_timeouts": {"section": {"section": {"step": NaN}}}}',
        '{"current_timeouts": {"section": "step:60"}}',
        "[" * 50_000,
    ],
)
def test_hostile_sections_state_falls_back_to_the_config(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_monitor: Callable[..., Monitor],
    content: str,
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    monkeypatch.setenv("NVRX_FT_MONITOR_SOCKET", str(monitor.socket_path))
    exp_dir = tmp_path / "ft"
    exp_dir.mkdir()
    (exp_dir / SECTIONS_STATE_FILENAME).write_text(content)
    ft = FaultToleranceSectionsCallback(
        autoresume=False, calculate_timeouts=True, exp_dir=exp_dir, logger_name="test.hostile"
    )
    with caplog.at_level(logging.INFO, logger="test.hostile"):
        tiny_fit(tmp_path, [ft], max_steps=2)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "Ignoring the FT state file" in w.getMessage()]) == 1
    assert "using the timeouts of the FT config" in caplog.text
    assert not ft.is_initialized
