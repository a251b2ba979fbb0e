"""A tiny Lightning training run by the nvrx-ptl tests: one process per rank.

Usage: ``python ptl_train.py '<json config>'`` (alone, or under torchrun/ft_launcher
for DDP on gloo). It prints ``RESULT {json}`` at the end, and ``PROBE {json}``
lines that show which FT sections were open at interesting moments.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ft import WorkloadAction, WorkloadControlRequest
from nvrx.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)

CFG: dict[str, Any] = json.loads(sys.argv[1])
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def emit(kind: str, record: dict[str, Any]) -> None:
    """One line in one write(2), so lines of several ranks sharing a pipe never mix."""
    sys.stdout.flush()
    os.write(1, f"{kind} {json.dumps(record)}\n".encode())


def probe(what: str, **data: Any) -> None:
    emit("PROBE", {"what": what, "rank": RANK, **data})


def open_sections(trainer: pl.Trainer) -> list[str] | None:
    for cb in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(cb, FaultToleranceSectionsCallback) and cb.fault_tol_client is not None:
            calc = cb.fault_tol_client.timeouts_calc
            return sorted(calc.open_sections) if calc is not None else None
    return None


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def setup(self, stage: str) -> None:
        probe("model_setup", open=open_sections(self.trainer), attempt=ATTEMPT)
        time.sleep(CFG.get("setup_sleep", 0.0))  # a realistic gap before the first heartbeat

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        if batch_idx == 0 or step == CFG.get("raise_at_step"):
            probe("training_step", step=step, open=open_sections(self.trainer))
        if step == CFG.get("raise_at_step"):
            raise RuntimeError(f"injected failure at step {step}")
        time.sleep(CFG.get("step_sleep", 0.0))
        if CFG.get("slow_rank") == RANK:
            time.sleep(CFG.get("slow_sleep", 0.0))
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        probe("save_checkpoint", step=self.trainer.global_step, open=open_sections(self.trainer))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(Callback):
    """Reports what the FT callbacks look like from the outside."""

    def __init__(self) -> None:
        self.steps_this_job = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(cb, FaultToleranceCallback) and cb.fault_tol_client is not None:
                probe("hb_timeouts", timeouts=str(cb.fault_tol_client.hb_timeouts))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        if self.steps_this_job == 0:
            probe("after_step", open=open_sections(trainer))
        self.steps_this_job += 1
        if self.steps_this_job == CFG.get("stop_after_steps"):
            trainer.should_stop = True  # like a max_time stop

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        scores = {k: float(v) for k, v in trainer.callback_metrics.items() if "_perf/" in k}
        probe("exception", error=repr(exception), open=open_sections(trainer), scores=scores)


def policy(exc: BaseException) -> WorkloadControlRequest:
    return WorkloadControlRequest(WorkloadAction.ShutdownWorkload, f"cannot recover from {exc!r}")


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s"
    )
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
    ckpt_dir = Path(CFG["ckpt_dir"])
    callbacks: list[Callback] = [Probe()]
    kinds = CFG.get("callbacks", ["ft"])
    ft_args = {
        "autoresume": CFG.get("autoresume", False),
        "calculate_timeouts": CFG.get("calculate_timeouts", True),
        # the fault hits the first attempt only, so the restarted job can finish
        "simulated_fault_params": CFG.get("simulated_fault") if ATTEMPT == 0 else None,
        "exp_dir": CFG.get("exp_dir"),
    }
    if "ft" in kinds:
        callbacks.append(FaultToleranceCallback(**ft_args))
    if "sections" in kinds:
        callbacks.append(
            FaultToleranceSectionsCallback(
                **ft_args, exc_handling_policy=policy if CFG.get("policy") else None
            )
        )
    if "straggler" in kinds:
        callbacks.append(StragglerDetectionCallback(**CFG.get("straggler", {})))
    callbacks.append(
        ModelCheckpoint(
            dirpath=ckpt_dir, save_last=True, every_n_train_steps=CFG.get("ckpt_every", 2)
        )
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp" if WORLD > 1 else "auto",
        max_steps=CFG.get("max_steps", 8),
        limit_val_batches=2,
        val_check_interval=CFG.get("val_every", 4),
        num_sanity_val_steps=0,
        callbacks=callbacks,
        logger=CSVLogger(CFG["log_dir"], name="csv", version=0),
        default_root_dir=CFG["log_dir"],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = ckpt_dir / "last.ckpt"
    trainer.fit(
        TinyModel(),
        train_dataloaders=DataLoader(data, batch_size=4),
        val_dataloaders=DataLoader(data, batch_size=4),
        ckpt_path=str(last) if last.exists() else None,
    )
    result = {"rank": RANK, "global_step": trainer.global_step, "attempt": ATTEMPT}
    emit("RESULT", result)


if __name__ == "__main__":
    main()
