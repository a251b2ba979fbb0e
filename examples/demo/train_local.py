"""The demo's second job: plain torch DDP that snapshots its state in memory every step.

Run by ``run_demo.py`` under ``ft_launcher --local-ckpt-every-n-steps=1``: the launcher
gives every rank its node's snapshot directory through the environment, so the script
has no path logic. At start ``LocalCheckpoints.restore`` finds the newest snapshot every
rank holds (none on the first attempt); each step trains, sends a heartbeat and hands
the state to ``maybe_save`` (a copy into memory; writing and replication run in the
background). Rank 1 SIGKILLs itself at ``--crash-at`` in the first attempt; the
restarted job resumes from the snapshot of the step before, so the crash costs at most
one step of work instead of everything since the last disk checkpoint.

Rank 0 appends one JSON line per attempt to ``<out>/attempts.jsonl`` (where it resumed
and from where) and writes ``<out>/result.json`` at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from synthetic import FEATURES, make_dataset  # the script's own folder is on sys.path
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from nvrx.ft import RankMonitorClient
from nvrx.ft.checkpointing.local import LocalCheckpoints


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--crash-at", type=int, default=100)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    client = RankMonitorClient()
    client.init_workload_monitoring()

    inputs, targets = make_dataset().tensors
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)

    def state_of(step: int) -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}

    local = LocalCheckpoints()  # the launcher's settings, from the environment
    restored = local.restore(state_of(0))
    step = 0
    if restored.state is not None:
        model.load_state_dict(restored.state["model"])
        opt.load_state_dict(restored.state["optim"])
        step = int(restored.state["step"])
    if rank == 0:
        with (args.out / "attempts.jsonl").open("a") as f:
            line = {"attempt": attempt, "start_step": step, "source": restored.source.value}
            f.write(json.dumps({**line, "restore_s": restored.seconds, "t": time.time()}) + "\n")
    client.send_heartbeat()

    loss = torch.zeros(())
    while step < args.steps:
        step += 1
        if attempt == 0 and rank == 1 and step == args.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, mid-training
        rows = torch.arange(32) + (step * 32 * world + rank * 32) % (len(inputs) - 32)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(inputs[rows]), targets[rows])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        time.sleep(args.step_time)
        client.send_heartbeat()
        local.maybe_save(step, state_of(step))

    local.close()
    if rank == 0:
        result = {"attempt": attempt, "global_step": step, "final_loss": float(loss)}
        (args.out / "result.json").write_text(json.dumps(result) + "\n")
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
