"""A tiny Lightning DDP job (gloo, CPU) with the nvrx callbacks, for the fault matrix.

FaultToleranceCallback (calculated timeouts kept under ``<out>/ft_state``),
StragglerDetectionCallback and a ModelCheckpoint every ``--checkpoint-every`` steps;
every attempt resumes from ``last.ckpt``. Each rank appends JSON lines to
``<out>/journal.jsonl``: ``resume`` (the step it starts from and the heartbeat
timeouts in force), one ``step`` per finished batch, ``done`` at the end.

``--fault KIND:RANK:STEP:ATTEMPT`` (KIND ``sigkill`` or ``raise``) hits global rank
RANK just before step STEP in attempt ATTEMPT.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import signal
import sys
from typing import Any

import torch
from _rank_journal import append_line
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ptl import FaultToleranceCallback, StragglerDetectionCallback

FEATURES = 8


class Journal(Callback):
    """Records where each attempt starts, every finished step, the end, and injects the fault."""

    def __init__(
        self, path: pathlib.Path, attempt: int, faults: dict[int, str], ft: FaultToleranceCallback
    ) -> None:
        self.path = path
        self.attempt = attempt
        self.faults = faults
        self.ft = ft

    def record(self, trainer: Trainer, event: str, **fields: Any) -> None:
        body = {"event": event, "rank": trainer.global_rank, "attempt": self.attempt, **fields}
        append_line(self.path, body)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        client = self.ft.fault_tol_client
        timeouts = None if client is None or client.hb_timeouts is None else client.hb_timeouts
        self.record(
            trainer,
            "resume",
            step=trainer.global_step,
            hb_timeouts=None
            if timeouts is None
            else {
                "initial": timeouts.initial,
                "subsequent": timeouts.subsequent,
                "were_calculated": timeouts.were_calculated,
            },
        )

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        kind = self.faults.get(trainer.global_step + 1)
        if kind is None:
            return
        self.record(trainer, "fault", kind=kind, step=trainer.global_step + 1)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("injected fault: exception in a Lightning training step")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.record(trainer, "step", step=trainer.global_step)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.record(trainer, "done", step=trainer.global_step)


class Regressor(LightningModule):
    """A linear model; small enough that a step costs nothing next to the start-up."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(FEATURES, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def parse_fault(spec: str) -> tuple[str, int, int, int]:
    kind, rank, step, attempt = spec.split(":")
    if kind not in ("sigkill", "raise"):
        raise SystemExit(f"--fault: unknown kind {kind!r}; expected sigkill or raise")
    return kind, int(rank), int(step), int(attempt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--fault", action="append", default=[], type=parse_fault)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s: %(message)s")

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    faults = {step: kind for kind, f_rank, step, f_attempt in args.fault
              if f_rank == rank and f_attempt == attempt}  # fmt: skip
    out: pathlib.Path = args.out
    last = out / "checkpoints" / "last.ckpt"

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, FEATURES, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=16)
    ft = FaultToleranceCallback(autoresume=False, calculate_timeouts=True, exp_dir=out / "ft_state")
    callbacks: list[Callback] = [
        ft,
        StragglerDetectionCallback(report_time_interval=2.0, enable_ptl_logging=False),
        ModelCheckpoint(
            dirpath=out / "checkpoints",
            filename="step{step}",
            every_n_train_steps=args.checkpoint_every,
            save_top_k=1,
            save_last=True,
        ),
        Journal(out / "journal.jsonl", attempt, faults, ft),
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
    trainer.fit(Regressor(), loader, ckpt_path=str(last) if last.exists() else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
