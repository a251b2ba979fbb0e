"""progress_from_trainer reads a real Trainer: limits, early stopping, the max_time timer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import EarlyStopping, Timer

from nvrx.ptl._ft_base import progress_from_trainer

from .conftest import tiny_fit


class _Slow(pl.Callback):
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *a: Any
    ) -> None:
        pl_module.log("constant", 1.0, on_step=False, on_epoch=True)
        time.sleep(0.02)


class _StatelessTimer(Timer):
    """A per-job time budget, like NeMo's: its elapsed time is not saved."""

    def state_dict(self) -> dict[str, Any]:
        return {}


@pytest.mark.timeout(120)
def test_max_steps(tmp_path: Path) -> None:
    trainer = tiny_fit(tmp_path, [], max_steps=3)
    progress = progress_from_trainer(trainer)  # type: ignore[arg-type]
    assert (progress.global_step, progress.max_steps) == (3, 3)
    assert not progress.early_stopped
    assert not progress.time_limit_reached


@pytest.mark.timeout(120)
def test_time_limit_that_spans_jobs(tmp_path: Path) -> None:
    trainer = tiny_fit(tmp_path, [_Slow(), Timer(duration="00:00:00:01")], max_steps=100000)
    progress = progress_from_trainer(trainer)  # type: ignore[arg-type]
    assert progress.global_step < 100000
    assert progress.time_limit_reached


@pytest.mark.timeout(120)
def test_per_job_time_budget_does_not_end_training(tmp_path: Path) -> None:
    budget = _StatelessTimer(duration="00:00:00:01")
    trainer = tiny_fit(tmp_path, [_Slow(), budget], max_steps=100000)
    progress = progress_from_trainer(trainer)  # type: ignore[arg-type]
    assert progress.global_step < 100000
    assert not progress.time_limit_reached


@pytest.mark.timeout(120)
def test_early_stopping(tmp_path: Path) -> None:
    stopper = EarlyStopping(monitor="constant", patience=0, check_on_train_epoch_end=True)
    trainer = tiny_fit(tmp_path, [_Slow(), stopper], max_steps=100000)
    progress = progress_from_trainer(trainer)  # type: ignore[arg-type]
    assert progress.global_step < 100000
    assert progress.early_stopped
