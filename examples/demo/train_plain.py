"""The demo's job without Lightning: plain torch DDP with nvrx.ft and nvrx.straggler.

Run it under ``ft_launcher``::

    ft_launcher --standalone --nproc-per-node=2 --max-restarts=2 \\
        --ft-rank-section-timeouts=step:30,checkpoint:60 \\
        examples/demo/train_plain.py --out /tmp/plain-ddp

Each step sends a heartbeat and runs inside the ``step`` section; checkpoints run in
the ``checkpoint`` section. The straggler Detector times the forward pass and prints a
report every few seconds on rank 0. A restarted job resumes from the last checkpoint.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import torch
import torch.distributed as dist
from synthetic import FEATURES, make_dataset  # the script's own folder is on sys.path
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from nvrx.ft import RankMonitorClient
from nvrx.straggler import Detector


def save_checkpoint(path: pathlib.Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    step: int, ft_state: dict[str, object]) -> None:  # fmt: skip
    tmp = path.with_suffix(".tmp")
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "ft": ft_state}
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a torn checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=-1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "checkpoint.pt"

    ft = RankMonitorClient()
    ft.init_workload_monitoring()
    Detector.initialize(report_time_interval=5.0, gather_on_rank0=True)

    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        ft.load_state_dict(state["ft"])
    dataset = make_dataset()
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            if step >= args.steps:
                break
            ft.start_section("step")
            with Detector.detection_section("forward", profile_cuda=False):
                if rank == args.slow_rank:
                    time.sleep(0.02)
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            ft.end_section("step")
            ft.send_heartbeat()
            step += 1
            report = Detector.generate_report_if_interval_elapsed()
            if report is not None and rank == 0:
                stragglers = report.identify_stragglers()
                print(f"step {step}: loss {loss.item():.4f}, stragglers {stragglers}", flush=True)
            if step % args.checkpoint_every == 0:
                ft.start_section("checkpoint")
                if rank == 0:
                    save_checkpoint(checkpoint, model, opt, step, ft.state_dict())
                dist.barrier()
                ft.end_section("checkpoint")
        epoch += 1

    if rank == 0:
        print(f"finished {step} steps, final loss {loss.item():.4f}", flush=True)
    Detector.shutdown()
    ft.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
