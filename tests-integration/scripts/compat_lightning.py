"""A Lightning DDP job (gloo, CPU) configured the way NeMo configures NVRx's callbacks.

Written from NeMo's documented call shapes, not its code:

- ``--style nemo2``: NeMo 2's FaultTolerancePlugin,
  ``FaultToleranceCallback(autoresume=True, calculate_timeouts=True, exp_dir=...)``, with
  NeMo 1 exp_manager's ``simulated_fault_params`` as an OmegaConf DictConfig (attempt 0
  only, so the restarted job can finish).
- ``--style sections-straggler``: ``FaultToleranceSectionsCallback(autoresume=False,
  calculate_timeouts=True, exp_dir=..., logger_name="nemo_logger...")`` and NeMo's recipe
  ``StragglerDetectionCallback(report_time_interval=..., calc_relative_gpu_perf=True,
  calc_individual_gpu_perf=True, num_gpu_perf_scores_to_print=5,
  gpu_relative_perf_threshold=0.7, gpu_individual_perf_threshold=0.7,
  stop_if_detected=True, enable_ptl_logging=True)``.

Both resume from ``<out>/checkpoints/last.ckpt``. Log records go through logging with
the logger name in each line (NeMo's ``nemo_logger`` names). Each rank appends JSON
lines to ``<out>/journal.jsonl``: ``resume`` (the FT timeouts in force), ``step``,
``done`` (with the keys of ``trainer.callback_metrics``).
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import sys
import time
from typing import Any

import torch
from _rank_journal import append_line
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    StragglerDetectionCallback,
)

FEATURES = 8


class Journal(Callback):
    """Records the timeouts each attempt starts with, every step and the end."""

    def __init__(
        self,
        path: pathlib.Path,
        attempt: int,
        ft: FaultToleranceCallback | FaultToleranceSectionsCallback,
    ) -> None:
        self.path = path
        self.attempt = attempt
        self.ft = ft

    def record(self, trainer: Trainer, event: str, **fields: Any) -> None:
        body = {"event": event, "rank": trainer.global_rank, "attempt": self.attempt, **fields}
        append_line(self.path, body)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        client = self.ft.fault_tol_client
        assert client is not None
        hb, sec = client.hb_timeouts, client.section_timeouts
        self.record(
            trainer,
            "resume",
            step=trainer.global_step,
            hb_timeouts=None
            if hb is None
            else {"initial": hb.initial, "subsequent": hb.subsequent},
            section_timeouts=None
            if sec is None
            else {"section": dict(sec.section), "out_of_section": sec.out_of_section},
        )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.record(trainer, "step", step=trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record(
            trainer,
            "done",
            step=trainer.global_step,
            metrics=sorted(trainer.callback_metrics),
        )


class Regressor(LightningModule):
    """A linear model whose step takes ``step_time`` seconds."""

    def __init__(self, step_time: float) -> None:
        super().__init__()
        self.net = torch.nn.Linear(FEATURES, 1)
        self.step_time = step_time

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_time)
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _callbacks(
    style: str, out: pathlib.Path, attempt: int, fault_delay: float, report_interval: float
) -> tuple[FaultToleranceCallback | FaultToleranceSectionsCallback, list[Callback]]:
    exp_dir = out / "ft_state"
    if style == "nemo2":
        fault = None
        if attempt == 0 and fault_delay > 0:
            fault = OmegaConf.create(
                {"fault_type": "rank_killed", "base_delay": fault_delay, "rank_to_fail": 1}
            )
        ft: FaultToleranceCallback | FaultToleranceSectionsCallback = FaultToleranceCallback(
            autoresume=True,
            calculate_timeouts=True,
            exp_dir=exp_dir,
            simulated_fault_params=fault,
        )
        return ft, [ft]
    # NVRx's logger name, passed explicitly: NeMo's handlers listen to nemo_logger.
    ft = FaultToleranceSectionsCallback(
        autoresume=False,
        calculate_timeouts=True,
        exp_dir=exp_dir,
        logger_name="nemo_logger.FaultToleranceSectionsCallback",
    )
    straggler = StragglerDetectionCallback(
        report_time_interval=report_interval,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_print=5,
        gpu_relative_perf_threshold=0.7,
        gpu_individual_perf_threshold=0.7,
        stop_if_detected=True,
        enable_ptl_logging=True,
    )
    return ft, [ft, straggler]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--style", choices=["nemo2", "sections-straggler"], required=True)
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--fault-delay", type=float, default=0.0)
    parser.add_argument("--report-interval", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(levelname)s: %(message)s")

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    world = int(os.environ["WORLD_SIZE"])
    out: pathlib.Path = args.out
    last = out / "checkpoints" / "last.ckpt"
    ft, callbacks = _callbacks(args.style, out, attempt, args.fault_delay, args.report_interval)

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(512, FEATURES, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=16)
    callbacks += [
        ModelCheckpoint(
            dirpath=out / "checkpoints",
            filename="step{step}",
            every_n_train_steps=args.checkpoint_every,
            save_top_k=1,
            save_last=True,
        ),
        Journal(out / "journal.jsonl", attempt, ft),
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=world,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.max_steps,
        max_epochs=-1,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=True,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(args.step_time), loader, ckpt_path=str(last) if last.exists() else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
