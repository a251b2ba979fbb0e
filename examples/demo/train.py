"""The demo's training script: Lightning DDP on CPU, run by ``ft_launcher``.

Each attempt (``TORCHELASTIC_RESTART_COUNT``) gets its fault from ``--faults``:
``kill,hang`` kills a rank in the first attempt and hangs one in the second; later
attempts run clean. One rank can be made slow on purpose (``--slow-rank``) so the
straggler report has something to find; its sleep also sets a floor on the step time,
so with the default step count both faults land mid-training on any machine. Training
resumes from the last checkpoint.
Rank 0 appends one JSON line per attempt to ``<out>/attempts.jsonl`` and writes
``<out>/result.json`` when training completes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import time
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from synthetic import FEATURES, make_dataset  # the script's own folder is on sys.path
from torch.utils.data import DataLoader

from nvrx.ptl import FaultToleranceCallback, SimulatedFaultParams, StragglerDetectionCallback
from nvrx.straggler import Report

FAULTS = {"kill": "rank_killed", "hang": "rank_hung"}


class Regressor(LightningModule):
    """A small MLP; one rank can be slowed down inside its forward step."""

    def __init__(self, slow_rank: int, slow_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
        )
        self.slow_rank = slow_rank
        self.slow_seconds = slow_seconds

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.slow_rank:
            time.sleep(self.slow_seconds)
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        self.log("train_loss", loss, sync_dist=False, prog_bar=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-3)


class AttemptJournal(Callback):
    """Rank 0 records where each attempt started and ended, and the final result."""

    def __init__(
        self, out: pathlib.Path, attempt: int, straggler: StragglerDetectionCallback
    ) -> None:
        self.out = out
        self.attempt = attempt
        self.straggler = straggler
        self.started_at = 0

    def _append(self, record: dict[str, Any]) -> None:
        with (self.out / "attempts.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started_at = trainer.global_step
        if trainer.is_global_zero:
            self._append(
                {"attempt": self.attempt, "start_step": trainer.global_step, "t": time.time()}
            )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        if trainer.is_global_zero:
            # The progress file the launcher's no-progress rule reads.
            (self.out / "progress").write_text(f"{trainer.global_step}\n")

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        loss = trainer.callback_metrics.get("train_loss")
        result = {
            "attempt": self.attempt,
            "start_step": self.started_at,
            "global_step": trainer.global_step,
            "final_loss": None if loss is None else float(loss),
        }
        write_json(self.out / "result.json", result)
        report = self.straggler.last_report
        if report is not None:
            write_json(self.out / "straggler_report.json", straggler_summary(report))


def write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # readers never see half a file


def straggler_summary(report: Report) -> dict[str, Any]:
    """The latest report: who is slow, the worst ranks per section, and all scores."""
    found = report.identify_stragglers(section_rel_threshold=0.7, gpu_rel_threshold=0.7)
    stragglers = sorted(
        {f"rank {s.rank} ({s.node})" for ids in found["straggler_sections_relative"].values()
         for s in ids} | {f"rank {s.rank} ({s.node})" for s in found["straggler_gpus_relative"]}
    )  # fmt: skip
    worst = [
        f"section {name}: rank {rank} score {score:.2f}, "
        f"median {report.section_median_times[name][rank]:.2f} ms"
        for name, scores in sorted(report.section_relative_perf_scores.items())
        for rank, score in sorted(scores.items(), key=lambda kv: kv[1])[:2]
    ]
    return {"stragglers": stragglers, "worst": worst, "report": report.to_dict()}


def simulated_fault(faults: list[str], attempt: int, delay: float) -> SimulatedFaultParams | None:
    if attempt >= len(faults) or faults[attempt] == "none":
        return None
    kind = FAULTS[faults[attempt]]
    return SimulatedFaultParams(fault_type=kind, base_delay=delay, rank_to_fail=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--faults", default="kill,hang", help="fault per attempt: kill|hang|none")
    parser.add_argument("--fault-delay", type=float, default=6.0)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-seconds", type=float, default=0.02)
    parser.add_argument("--report-interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    bad = [f for f in args.faults.split(",") if f not in (*FAULTS, "none")]
    if bad:
        parser.error(f"--faults: unknown fault {bad[0]!r} (use kill, hang or none)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(name)s: %(message)s",
    )
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoints = args.out / "checkpoints"
    last = checkpoints / "last.ckpt"

    torch.manual_seed(0)
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True, num_workers=0)
    straggler = StragglerDetectionCallback(
        report_time_interval=args.report_interval,
        calc_relative_gpu_perf=True,
        calc_individual_gpu_perf=True,
        num_gpu_perf_scores_to_print=2,
        stop_if_detected=False,
        logger_name="demo.straggler",
    )
    callbacks: list[Callback] = [
        FaultToleranceCallback(
            autoresume=False,
            calculate_timeouts=True,
            simulated_fault_params=simulated_fault(
                args.faults.split(","), attempt, args.fault_delay
            ),
            exp_dir=args.out / "ft_state",
        ),
        straggler,
        ModelCheckpoint(
            dirpath=checkpoints,
            filename="step{step}",
            every_n_train_steps=args.checkpoint_every,
            save_top_k=1,
            save_last=True,
        ),
        AttemptJournal(args.out, attempt, straggler),
    ]
    trainer = Trainer(
        accelerator="cpu",
        devices=world_size,
        strategy=DDPStrategy(process_group_backend="gloo") if world_size > 1 else "auto",
        max_steps=args.max_steps,
        max_epochs=-1,
        callbacks=callbacks,
        logger=CSVLogger(args.out, name="logs", version=f"attempt{attempt}"),
        log_every_n_steps=10,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Regressor(args.slow_rank, args.slow_seconds)
    trainer.fit(model, loader, ckpt_path=str(last) if last.exists() else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
