"""The callbacks log the restart cycle, restart count and goodput so far (issue 18 item 4):
real lightning.Trainer fits, a cycle-info file written with nvrx.ft.write_cycle_info,
real rank monitors for the FT callbacks."""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.loggers import CSVLogger, Logger

from nvrx.ft import CYCLE_INFO_ENV, CycleGoodput, CycleInfo, CycleNode, write_cycle_info
from nvrx.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)
from nvrx.ptl._cycle_metrics import CYCLE_METRICS

from .conftest import Monitor, tiny_fit

pytestmark = [pytest.mark.timeout(180)]

HB_CFG = {"initial_rank_heartbeat_timeout": 300.0, "rank_heartbeat_timeout": 300.0}
SECTION_CFG = {
    "initial_rank_heartbeat_timeout": None,
    "rank_heartbeat_timeout": None,
    "rank_section_timeouts": {"setup": 300.0, "step": 300.0, "checkpointing": 300.0},
    "rank_out_of_section_timeout": 300.0,
}
EXPECTED = {
    "nvrx/cycle": 2.0,
    "nvrx/restart_count": 2.0,
    "nvrx/goodput/ettr": 0.75,
    "nvrx/goodput/productive_s": 90.0,
    "nvrx/goodput/wall_s": 120.0,
}


class Recording(Logger):
    """A Lightning logger that keeps every log_metrics call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict[str, float], int | None]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))

    def cycle_calls(self) -> list[dict[str, float]]:
        return [m for m, _ in self.calls if any(k.startswith("nvrx/") for k in m)]


def _cycle_info(path: Path, cycle: int = 2) -> Path:
    write_cycle_info(
        path,
        CycleInfo(
            job_id="77",
            cycle=cycle,
            restart_count=cycle,
            started_at=1_764_590_000.0,
            cause="crash: rank 0 exited with 1",
            nodes=(CycleNode("node-a", 0),),
            ranks=(0,),
            goodput=CycleGoodput(productive_s=90.0, wall_s=120.0, ettr=0.75),
        ),
    )
    return path


def _nvrx_metrics(trainer: Any) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("nvrx/")}


@pytest.fixture
def hb_monitor(make_monitor: Callable[..., Monitor], monkeypatch: pytest.MonkeyPatch) -> Monitor:
    monitor = make_monitor(**HB_CFG)
    for key, value in monitor.env.items():
        monkeypatch.setenv(key, value)
    return monitor


@pytest.mark.multiprocess
def test_ft_callback_logs_the_cycle_to_callback_metrics_and_the_csv_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hb_monitor: Monitor
) -> None:
    monkeypatch.setenv(CYCLE_INFO_ENV, str(_cycle_info(tmp_path / "cycle_info.77.0.2")))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "9")  # the file wins
    csv_logger = CSVLogger(tmp_path / "csv", name="run")
    callback = FaultToleranceCallback(autoresume=False, calculate_timeouts=False)
    trainer = tiny_fit(tmp_path, [callback], max_steps=4, logger=csv_logger)
    assert _nvrx_metrics(trainer) == EXPECTED
    with open(Path(csv_logger.log_dir) / "metrics.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    logged = [r for r in rows if r.get("nvrx/cycle")]
    assert len(logged) == 1
    assert {k: float(logged[0][k]) for k in CYCLE_METRICS} == EXPECTED
    assert logged[0]["step"] == "0"


@pytest.mark.multiprocess
def test_sections_callback_logs_the_cycle_once_before_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_monitor: Callable[..., Monitor]
) -> None:
    monitor = make_monitor(**SECTION_CFG)
    for key, value in monitor.env.items():
        monkeypatch.setenv(key, value)
    path = _cycle_info(tmp_path / "c")

    class RewriteMidFit(pl.Callback):
        """Changes the file during training: the callbacks must not read it again."""

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            if trainer.global_step == 1:
                _cycle_info(path, cycle=5)

    monkeypatch.setenv(CYCLE_INFO_ENV, str(path))
    recording = Recording()
    callback = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False)
    trainer = tiny_fit(tmp_path, [callback, RewriteMidFit()], max_steps=4, logger=recording)
    assert _nvrx_metrics(trainer) == EXPECTED
    assert recording.cycle_calls() == [EXPECTED]


def test_straggler_callback_logs_the_cycle_and_only_one_callback_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CYCLE_INFO_ENV, str(_cycle_info(tmp_path / "c")))
    recording = Recording()
    first = StragglerDetectionCallback(report_time_interval=3600.0)
    second = StragglerDetectionCallback(report_time_interval=3600.0)
    trainer = tiny_fit(tmp_path, [first, second], max_steps=3, logger=recording)
    assert _nvrx_metrics(trainer) == EXPECTED
    assert recording.cycle_calls() == [EXPECTED]


def test_nothing_is_logged_when_the_variable_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CYCLE_INFO_ENV, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    recording = Recording()
    trainer = tiny_fit(
        tmp_path, [StragglerDetectionCallback(report_time_interval=3600.0)], logger=recording
    )
    assert _nvrx_metrics(trainer) == {}
    assert recording.cycle_calls() == []


def test_without_ptl_logging_the_straggler_callback_logs_no_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CYCLE_INFO_ENV, str(_cycle_info(tmp_path / "c")))
    callback = StragglerDetectionCallback(report_time_interval=3600.0, enable_ptl_logging=False)
    trainer = tiny_fit(tmp_path, [callback])
    assert _nvrx_metrics(trainer) == {}


@pytest.mark.parametrize(("restarts", "expected"), [("3", {"nvrx/restart_count": 3.0}), ("x", {})])
def test_an_unusable_file_leaves_torchelastic_restart_count(
    restarts: str,
    expected: dict[str, float],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = tmp_path / "c"
    broken.write_text('{"schema_version": 1, "cycle": "two"}')
    monkeypatch.setenv(CYCLE_INFO_ENV, str(broken))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restarts)
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.cycle_info"):
        trainer = tiny_fit(tmp_path, [StragglerDetectionCallback(report_time_interval=3600.0)])
    assert _nvrx_metrics(trainer) == expected
    warnings = [r for r in caplog.records if r.name == "nvrx.ft.cycle_info"]
    assert len(warnings) == 1
    assert str(broken) in warnings[0].getMessage()


def test_a_distributed_run_gets_no_sync_dist_advice_for_the_cycle_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a process group up, Lightning advises sync_dist=True once per epoch-level
    # metric; every rank reads the same file, so the advice is muted for nvrx/ names.
    import socket
    import warnings as warnings_module

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(CYCLE_INFO_ENV, str(_cycle_info(tmp_path / "c")))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with warnings_module.catch_warnings(record=True) as caught:
            warnings_module.simplefilter("always")
            trainer = tiny_fit(
                tmp_path, [StragglerDetectionCallback(report_time_interval=3600.0)], max_steps=2
            )
    finally:
        dist.destroy_process_group()
    assert _nvrx_metrics(trainer) == EXPECTED
    advice = [str(w.message) for w in caught if "sync_dist" in str(w.message)]
    assert not [m for m in advice if "nvrx/" in m], advice
