"""A Megatron-style DDP loop with local checkpoints: restore at start, save every N steps.

Under ft_launcher (the launcher gives every rank the snapshot directory and interval)::

    ft_launcher --standalone --nproc-per-node=2 --max-restarts=3 \\
        --local-ckpt-every-n-steps=5 \\
        examples/local_checkpoint/train_ddp.py --out /tmp/lc-example --crash-at 23

Without ft_launcher (plain torchrun), ``--local-dir`` gives the node directory and the
script builds the settings itself::

    torchrun --standalone --nproc-per-node=2 examples/local_checkpoint/train_ddp.py \\
        --out /tmp/lc-example --local-dir /dev/shm/lc-example --every 5

Rank 0 also writes a disk ("global") checkpoint every ``--disk-every`` steps, as jobs
do today. At start, the newest of the local snapshot and the disk checkpoint wins.
``--crash-at STEP`` makes rank 1 crash once at that step (first attempt only), so a
restarted job shows where it resumed from: with local snapshots every 5 steps, at
most 4 steps are recomputed instead of up to ``--disk-every``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nvrx.ft.checkpointing.local import LocalCheckpoints, LocalCkptSettings, RestoreSource


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--disk-every", type=int, default=20)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--local-dir", type=pathlib.Path, default=None)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
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

    # The launcher's environment, else the settings given on the command line.
    settings = LocalCkptSettings.from_env()
    if settings is None and args.local_dir is not None:
        node_dir = args.local_dir / f"node{os.environ.get('GROUP_RANK', '0')}"
        node_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        settings = LocalCkptSettings(
            node_dir=node_dir, job_id="train-ddp-example", every_n_steps=args.every
        )
    local = LocalCheckpoints(settings)

    disk = args.out / "disk_checkpoint.pt"
    disk_step = int(torch.load(disk, weights_only=True)["step"]) if disk.exists() else None
    restored = local.restore(state_of(0), global_iteration=disk_step)
    step = 0
    if restored.source in (RestoreSource.OWN, RestoreSource.PEER):
        assert restored.state is not None
        step = load(restored.state)
    elif restored.source is RestoreSource.GLOBAL and disk_step is not None:
        step = load(torch.load(disk, weights_only=True))
    if rank == 0:
        print(
            f"attempt {attempt}: resuming after step {step} "
            f"(from {restored.source.value}, {restored.seconds:.3f} s)",
            flush=True,
        )

    loss_fn = nn.MSELoss()
    while step < args.steps:
        step += 1
        if args.crash_at == step and rank == 1 and attempt == 0:
            print(f"rank 1 crashes at step {step}", flush=True)
            os._exit(1)
        gen = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), x.sum(dim=1, keepdim=True).sin())
        loss.backward()
        opt.step()
        local.maybe_save(step, state_of(step))
        if step % args.disk_every == 0 and rank == 0:
            tmp = disk.with_suffix(".tmp")
            torch.save(state_of(step), tmp)
            os.replace(tmp, disk)
    dist.barrier()
    local.close()
    if rank == 0:
        print(f"done at step {step}, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
