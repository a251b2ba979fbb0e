"""A Lightning fit with local snapshots, run by test_local_ckpt_callback.py.

Usage: ``python local_ckpt_train.py '<json config>'`` (alone, or as the ranks of
ft_launcher/torchrun). Every step's data come from a generator seeded with the global
step, so the weights after N steps depend only on the state restored, not on where
the data loader was: a run killed and resumed from a snapshot ends with exactly the
weights of an unfaulted run iff the snapshot held the whole training state (weights,
Adam moments, scheduler, loop counters).

Config keys: ``max_steps``, ``every`` (snapshot every N steps), ``manager_dir`` (a
LocalCheckpointManager there, wrapped NeMo-style; absent: the launcher's
environment), ``global_dir``/``global_every`` (a global ModelCheckpoint),
``ckpt_path``, ``kill_at`` (SIGKILL itself after that step's snapshot, first attempt
only), ``fail_at`` (raise at that step, first attempt only), ``step_sleep``.
Prints ``START {json}`` when training starts, ``RESULT {json}`` at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from nvrx.ptl.local_checkpoint_callback import HierarchicalCheckpointIO, LocalCheckpointCallback

CFG: dict[str, Any] = json.loads(sys.argv[1])
RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def emit(kind: str, record: dict[str, Any]) -> None:
    sys.stdout.flush()
    os.write(1, f"{kind} {json.dumps({'rank': RANK, **record})}\n".encode())


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        step = self.trainer.global_step
        if ATTEMPT == 0 and step == CFG.get("fail_at"):
            raise RuntimeError(f"injected failure at step {step}")
        gen = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(8, 4, generator=gen)
        y = x.sum(dim=1, keepdim=True).sin()
        time.sleep(CFG.get("step_sleep", 0.0))
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.01, betas=(0.8, 0.95))
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Report(Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        emit("START", {"global_step": trainer.global_step, "ckpt_path": trainer.ckpt_path})

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if (
            ATTEMPT == 0
            and trainer.global_step == CFG.get("kill_at")
            and CFG.get("kill_rank", RANK) == RANK
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        opt = trainer.optimizers[0]
        state = [
            {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for s in opt.state.values()
        ]
        emit(
            "RESULT",
            {
                "global_step": trainer.global_step,
                "params": [p.detach().tolist() for p in pl_module.parameters()],
                "opt_state": state,
                "lr": opt.param_groups[0]["lr"],
            },
        )


def main() -> None:
    callbacks: list[Callback] = []
    if CFG.get("global_dir"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=CFG["global_dir"],
                every_n_train_steps=CFG["global_every"],
                save_top_k=-1,
                filename="{step}",
            )
        )
    every = CFG.get("every")
    callbacks += [LocalCheckpointCallback(every_n_train_steps=every), Report()]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        max_steps=CFG["max_steps"],
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=CFG.get("root_dir"),
    )
    if CFG.get("manager_dir"):
        from nvrx.ft.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

        manager = LocalCheckpointManager(CFG["manager_dir"])
        trainer.strategy.checkpoint_io = HierarchicalCheckpointIO(
            trainer.strategy.checkpoint_io, manager, None
        )
    data = DataLoader(TensorDataset(torch.zeros(16, 1)), batch_size=2)  # 8 steps an epoch
    trainer.fit(Model(), train_dataloaders=data, ckpt_path=CFG.get("ckpt_path"))


if __name__ == "__main__":
    main()
