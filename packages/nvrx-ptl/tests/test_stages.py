"""The callbacks are inert outside fit: validate/test need no monitor and no detector."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)
from nvrx.straggler import Detector


class _Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("v", self.layer(batch[0]).mean())

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("t", self.layer(batch[0]).mean())


@pytest.mark.timeout(120)
def test_validate_and_test_leave_ft_and_straggler_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NVRX_FT_MONITOR_SOCKET", raising=False)
    ft = FaultToleranceCallback(autoresume=True, calculate_timeouts=True)
    sections = FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False)
    straggler = StragglerDetectionCallback(report_time_interval=1.0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[ft, sections, straggler],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer.validate(_Model(), loader)
    trainer.test(_Model(), loader)
    assert not ft.is_initialized
    assert not sections.is_initialized
    assert not straggler.initialized
    assert not Detector.initialized
