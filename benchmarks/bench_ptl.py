"""Per-step cost of the nvrx.ptl callbacks' hot hooks.

Measured inside a real single-process Lightning fit against a real rank monitor:
the heartbeat hook, a 'step' section open+close of the sections callback, and the
straggler callback's batch start+end when no report is due.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from _common import Metric, median_ns_per_call

AREA = "ptl"


def run(quick: bool) -> list[Metric]:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from nvrx.ft import FaultToleranceConfig, RankMonitorServer, create_runtime_dir
    from nvrx.ptl import (
        FaultToleranceCallback,
        FaultToleranceSectionsCallback,
        StragglerDetectionCallback,
    )

    calls, samples = (2_000, 9) if quick else (20_000, 31)
    runtime = create_runtime_dir("nvrx-bench-ptl-")
    work = Path(tempfile.mkdtemp(prefix="nvrx-bench-ptl-"))
    cfg = FaultToleranceConfig(
        rank_section_timeouts={"setup": 600.0, "step": 600.0, "checkpointing": 600.0}
    )
    monitor = RankMonitorServer.run_in_subprocess(cfg, runtime / "monitor-0.sock")
    old_env = os.environ.get("NVRX_FT_MONITOR_SOCKET")
    os.environ["NVRX_FT_MONITOR_SOCKET"] = str(runtime / "monitor-0.sock")
    results: dict[str, float] = {}

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.layer(batch[0]).pow(2).mean()
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Measure(pl.Callback):
        def __init__(self, target: pl.Callback) -> None:
            self.target = target

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            t: Any = self.target
            if isinstance(t, FaultToleranceCallback):
                results["heartbeat hook"] = median_ns_per_call(
                    lambda: t.on_train_batch_end(trainer, pl_module, None, None, 0),
                    calls_per_sample=calls,
                    samples=samples,
                )
            elif isinstance(t, FaultToleranceSectionsCallback):

                def pair() -> None:
                    t._start_section("step")
                    t._end_section("step")

                results["section open+close"] = median_ns_per_call(
                    pair, calls_per_sample=calls, samples=samples
                )
            else:

                def step() -> None:
                    t.on_train_batch_start(trainer, pl_module, None, 0)
                    t.on_train_batch_end(trainer, pl_module, None, None, 0)

                results["straggler batch start+end"] = median_ns_per_call(
                    step, calls_per_sample=calls, samples=samples
                )

    try:
        monitor.wait_ready()
        targets: list[pl.Callback] = [
            FaultToleranceCallback(autoresume=False, calculate_timeouts=False),
            FaultToleranceSectionsCallback(autoresume=False, calculate_timeouts=False),
            StragglerDetectionCallback(report_time_interval=1e9),
        ]
        for target in targets:
            trainer = pl.Trainer(
                accelerator="cpu",
                devices=1,
                max_steps=1,
                callbacks=[target, Measure(target)],
                default_root_dir=work,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
            )
            trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4))
    finally:
        if old_env is None:
            os.environ.pop("NVRX_FT_MONITOR_SOCKET", None)
        else:
            os.environ["NVRX_FT_MONITOR_SOCKET"] = old_env
        monitor.stop()
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return [Metric(AREA, name, value, "ns", samples) for name, value in results.items()]
