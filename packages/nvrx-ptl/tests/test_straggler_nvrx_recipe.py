"""StragglerDetectionCallback called as NeMo's recipe calls it behaves as NVRx's.

GPU scores come from synthetic kernel records fed through the real detector (a
:class:`~nvrx.straggler._kernels.SyntheticKernelTimer`), so the GPU path runs on CPU with a
real ``lightning.Trainer``: GPU stragglers stop the job (the last checkpoint is saved, then
``SystemExit(1)``), section stragglers only when opted in, and the logged scores reach
``trainer.callback_metrics`` where EarlyStopping reads them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from nvrx.ptl import StragglerDetectionCallback
from nvrx.straggler import Detector, Report
from nvrx.straggler._kernels import SyntheticKernelRecord, SyntheticKernelTimer

from .conftest import tiny_fit

#: nemo/collections/llm/recipes/callbacks/common.py
NEMO_RECIPE: dict[str, Any] = {
    "report_time_interval": 300,
    "calc_relative_gpu_perf": True,
    "calc_individual_gpu_perf": True,
    "num_gpu_perf_scores_to_print": 5,
    "gpu_relative_perf_threshold": 0.7,
    "gpu_individual_perf_threshold": 0.7,
    "stop_if_detected": True,
    "enable_ptl_logging": True,
}
LOGGER = "test.recipe"


@pytest.fixture
def kernels() -> Iterator[SyntheticKernelTimer]:
    """A detector reporting every 0.3 s (not the recipe's 300 s) with synthetic kernels."""
    timer = SyntheticKernelTimer()
    Detector.initialize(scores_to_compute="all", report_time_interval=0.3, kernel_timer=timer)
    try:
        yield timer
    finally:
        Detector.shutdown()


class KernelModel(pl.LightningModule):
    """Each step runs one 'kernel' and sleeps; after the first report either gets slower."""

    def __init__(
        self,
        timer: SyntheticKernelTimer,
        straggler: StragglerDetectionCallback,
        slow_kernel: bool = False,
        slow_step: bool = False,
    ) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.timer, self.straggler = timer, straggler
        self.slow_kernel, self.slow_step = slow_kernel, slow_step

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        after_first_report = self.straggler.last_report is not None
        kernel_ns = 3_000_000 if self.slow_kernel and after_first_report else 1_000_000
        self.timer.feed([SyntheticKernelRecord("gemm", 1, 1 + kernel_ns)])
        time.sleep(0.03 if self.slow_step and after_first_report else 0.002)
        loss: torch.Tensor = self.layer(batch[0]).pow(2).mean()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Ending(pl.Callback):
    """What the trainer looked like when fit was interrupted."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.error: BaseException | None = None
        self.metrics: dict[str, float] = {}

    def on_exception(self, trainer: pl.Trainer, pl_module: Any, exception: BaseException) -> None:
        self.step, self.error = trainer.global_step, exception
        self.metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}


class StopAfterReports(pl.Callback):
    """Ends fit (cleanly) after the straggler callback's third report."""

    def __init__(self, straggler: StragglerDetectionCallback) -> None:
        self.straggler, self.reports = straggler, 0
        self.last: Report | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.straggler.last_report is not self.last:
            self.last, self.reports = self.straggler.last_report, self.reports + 1
        if self.reports >= 3:
            trainer.should_stop = True


@pytest.mark.timeout(120)
def test_gpu_straggler_saves_last_checkpoint_then_exits_1(
    tmp_path: Path, kernels: SyntheticKernelTimer, caplog: pytest.LogCaptureFixture
) -> None:
    straggler = StragglerDetectionCallback(**NEMO_RECIPE, logger_name=LOGGER)
    ending = Ending()
    model = KernelModel(kernels, straggler, slow_kernel=True)
    with caplog.at_level(logging.INFO, logger=LOGGER), pytest.raises(SystemExit) as info:
        tiny_fit(
            tmp_path,
            [straggler, ending],
            max_steps=100_000,
            model=model,
            ckpt_dir=tmp_path / "ckpt",
            ckpt_every=100_000,
        )
    assert info.value.code == 1
    assert "STRAGGLER DETECTION WARNING: Some GPUs performance dropped" in caplog.text
    assert "GPU relative performance:" in caplog.text
    assert "Detected stragglers. Terminating training..." in caplog.text
    last = tmp_path / "ckpt" / "last.ckpt"
    assert f"Saved checkpoint {last} before stopping" in caplog.text
    assert torch.load(last, weights_only=False)["global_step"] == ending.step
    assert ending.metrics["gpu_individual_perf/min"] < 0.7, ending.metrics
    assert ending.metrics["gpu_relative_perf/min"] == pytest.approx(1.0)
    assert {"gpu_relative_perf/median", "gpu_individual_perf/max"} <= set(ending.metrics)
    assert not straggler.initialized


@pytest.mark.timeout(120)
@pytest.mark.parametrize("opt_in", [False, True])
def test_section_stragglers_stop_only_when_opted_in(
    tmp_path: Path, kernels: SyntheticKernelTimer, caplog: pytest.LogCaptureFixture, opt_in: bool
) -> None:
    straggler = StragglerDetectionCallback(
        **NEMO_RECIPE, stop_on_section_scores=opt_in, logger_name=LOGGER
    )
    model = KernelModel(kernels, straggler, slow_step=True)
    stop = StopAfterReports(straggler)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        # no checkpoint callback: a stop only sets should_stop and fit returns (as NVRx)
        tiny_fit(tmp_path, [straggler, stop], max_steps=100_000, model=model)
    assert "Section 'train_step' got slower than its own best" in caplog.text
    assert "Some GPUs" not in caplog.text, "the kernels kept their speed"
    assert ("Detected stragglers. Terminating training..." in caplog.text) is opt_in
    assert ("No checkpoint callback" in caplog.text) is opt_in
    assert stop.reports == (2 if opt_in else 3), "section scores alone stop only when opted in"


@pytest.mark.timeout(120)
def test_early_stopping_watches_a_logged_gpu_score(
    tmp_path: Path, kernels: SyntheticKernelTimer
) -> None:
    straggler = StragglerDetectionCallback(
        **{**NEMO_RECIPE, "stop_if_detected": False}, logger_name=LOGGER
    )
    early = EarlyStopping(
        monitor="gpu_individual_perf/min",
        mode="max",
        divergence_threshold=0.7,
        patience=1_000_000,  # only the threshold stops it
        check_on_train_epoch_end=True,
        strict=False,
    )
    model = KernelModel(kernels, straggler, slow_kernel=True)
    trainer: Any = tiny_fit(tmp_path, [straggler, early], max_steps=100_000, model=model)
    assert early.stopped_epoch > 0, "EarlyStopping saw the score fall below 0.7"
    assert trainer.global_step < 100_000
    assert float(trainer.callback_metrics["gpu_individual_perf/min"]) < 0.7
