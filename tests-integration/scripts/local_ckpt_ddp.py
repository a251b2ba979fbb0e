"""A deterministic DDP job with AdamW (gloo, CPU) that takes local snapshots, under ft_launcher.

Every step trains a small MLP on data drawn from the step number and the rank (so a
step repeated after a restart computes exactly what it computed before), then hands
the state (model, optimizer, step, RNG) to ``LocalCheckpoints.maybe_save``. Rank 0 also
writes a disk checkpoint every ``--disk-every`` steps, as users do today. At start the
job asks ``LocalCheckpoints.restore`` for the newest snapshot every rank can restore
(own node or a peer) and falls back to the disk checkpoint when there is none.

Each rank appends JSON lines to ``<out>/journal.jsonl``: ``start``, ``restored``
(iteration, source), one ``step`` per step with its loss, ``fault``, ``done``.
``--no-local`` runs the same job with the disk checkpoint only (the baseline).

Faults: ``--fault KIND:RANK:STEP:ATTEMPT`` (KIND ``sigkill`` or ``sigstop``; ATTEMPT an
integer or ``*``) makes global rank RANK do KIND just before step STEP.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import pathlib
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from _rank_journal import Journal
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nvrx.ft import RankMonitorClient
from nvrx.ft.checkpointing.local import LocalCheckpoints


def parse_fault(spec: str) -> tuple[str, int, int, str]:
    kind, rank, step, attempt = spec.split(":")
    if kind not in ("sigkill", "sigstop"):
        raise SystemExit(f"--fault: unknown kind {kind!r}")
    return kind, int(rank), int(step), attempt


def batch(step: int, rank: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(32, width, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def exact_mse(out: torch.Tensor, target: torch.Tensor) -> float:
    """The loss, correctly rounded whatever the memory layout.

    torch's mean is a vectorised sum whose order (and so its last bit) can follow the
    alignment of the tensor, which differs between processes; the gradient does not
    depend on it. The elementwise differences are exact, and ``math.fsum`` rounds once.
    """
    diffs = (out.detach() - target).flatten().tolist()
    return math.fsum(d * d for d in diffs) / len(diffs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--disk-every", type=int, default=1000)
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--fault", action="append", default=[], type=parse_fault)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out: pathlib.Path = args.out
    journal = Journal(out / "journal.jsonl", rank=rank, attempt=attempt)
    journal.record("start", pid=os.getpid(), world=int(os.environ["WORLD_SIZE"]))
    faults = {
        step: kind
        for kind, f_rank, step, f_attempt in args.fault
        if f_rank == rank and f_attempt in ("*", str(attempt))
    }
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    client = RankMonitorClient()
    client.init_workload_monitoring()
    # The first heartbeat comes after the restore: DDP's first use imports torch._dynamo
    # and the restore is a collective, both covered by the initial heartbeat timeout.

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, 128), nn.Tanh(), nn.Linear(128, 1))
    # find_unused_parameters: DDP then never rebuilds its gradient buckets after a
    # process's first iteration. The rebuild changes where each gradient sits in the
    # all-reduced buffer and so the order of the float sums; a restarted process would
    # rebuild at a different step from the unfaulted run and differ in the last bits.
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)

    def state_of(step: int) -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "step": step,
            "rng": torch.get_rng_state(),
        }

    def load(state: dict[str, Any]) -> int:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        return int(state["step"])

    disk = out / "disk_checkpoint.pt"
    disk_step = int(torch.load(disk, weights_only=True)["step"]) if disk.exists() else None
    step, source = 0, "none"
    local = None if args.no_local else LocalCheckpoints()
    t0 = time.monotonic()
    if local is not None:
        restored = local.restore(state_of(0), global_iteration=disk_step)
        source = restored.source.value
        if restored.state is not None:
            step = load(restored.state)
    if source in ("none", "global") and disk_step is not None:
        step = load(torch.load(disk, weights_only=True))
        source = "global"
    journal.record("restored", step=step, source=source, restore_s=time.monotonic() - t0)
    client.send_heartbeat()

    loss_fn = nn.MSELoss()
    while step < args.steps:
        step += 1
        if step in faults:
            journal.record("fault", kind=faults[step], step=step)
            os.kill(os.getpid(), signal.SIGKILL if faults[step] == "sigkill" else signal.SIGSTOP)
        x, y = batch(step, rank, args.width)
        opt.zero_grad(set_to_none=True)
        pred = ddp(x)
        loss = loss_fn(pred, y)
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        client.send_heartbeat()
        journal.record("step", step=step, loss=exact_mse(pred, y))
        if local is not None:
            local.maybe_save(step, state_of(step))
        if step % args.disk_every == 0 and rank == 0:
            tmp = disk.with_suffix(".tmp")
            torch.save(state_of(step), tmp)
            os.replace(tmp, disk)
            journal.record("disk_checkpoint", step=step)

    dist.barrier()
    if local is not None:
        local.close()
    journal.record("done", step=step)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
