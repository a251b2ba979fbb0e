"""A tiny deterministic job on the GPU, run under ft_launcher (the gpu tests and
``tools/gpu_check.py``).

Like ``ddp_steps.py``, but every rank works on CUDA tensors: each step multiplies a
matrix on the GPU, all-reduces ``step * (rank + 1)`` as a CUDA tensor (heartbeating
while it waits for the peers), adds the result to a running total and journals the
step. Every ``--checkpoint-every`` steps, once every rank has journalled the step (one
more all-reduce), rank 0 checkpoints ``(step, total)``; every attempt resumes from the
checkpoint, so ``assert_every_step_once`` applies.

``--backend``: ``nccl``, ``gloo`` (gloo's CUDA all-reduce) or ``auto`` (the default):
NCCL where each local rank has a GPU of its own, else gloo, since NCCL refuses two
ranks on one GPU. The ``start`` record names the backend and the device.

Faults: ``--fault KIND:RANK:STEP:ATTEMPT`` (KIND ``sigkill`` or ``sigstop``; ATTEMPT an
integer or ``*``) makes global rank RANK do KIND just before step STEP.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import sys
import time

import torch
import torch.distributed as dist
from _rank_journal import Journal, write_atomic

from nvrx.ft import RankMonitorClient

BACKENDS = ("auto", "nccl", "gloo")


def parse_fault(spec: str) -> tuple[str, int, int, str]:
    kind, rank, step, attempt = spec.split(":")
    if kind not in ("sigkill", "sigstop"):
        raise SystemExit(f"--fault: unknown kind {kind!r}; expected sigkill or sigstop")
    return kind, int(rank), int(step), attempt


def choose_backend(asked: str, local_world: int, gpus: int) -> str:
    """``asked``, or for ``auto`` NCCL when every local rank has its own GPU, else gloo."""
    if asked != "auto":
        return asked
    return "nccl" if gpus >= local_world else "gloo"


def all_reduce_alive(value: torch.Tensor, client: RankMonitorClient) -> None:
    """All-reduce ``value``, heartbeating while a peer keeps us waiting, so only the
    faulty rank's monitor acts."""
    work = dist.all_reduce(value, async_op=True)
    assert work is not None
    while not work.is_completed():
        client.send_heartbeat()
        time.sleep(0.005)
    work.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--size", type=int, default=1024, help="matrix side of each step")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--fault", action="append", default=[], type=parse_fault)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out: pathlib.Path = args.out
    journal = Journal(out / "journal.jsonl", rank=rank, attempt=attempt)
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", local_rank % max(gpus, 1))
    torch.cuda.set_device(device)
    backend = choose_backend(args.backend, local_world, gpus)
    journal.record(
        "start",
        pid=os.getpid(),
        world=int(os.environ["WORLD_SIZE"]),
        backend=backend,
        device=str(device),
        gpu=torch.cuda.get_device_name(device),
    )
    faults = {
        step: kind
        for kind, f_rank, step, f_attempt in args.fault
        if f_rank == rank and f_attempt in ("*", str(attempt))
    }
    dist.init_process_group(
        backend,
        timeout=datetime.timedelta(seconds=60),
        device_id=device if backend == "nccl" else None,
    )
    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()

    checkpoint = out / "checkpoint.json"
    step, total = 0, 0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        step, total = int(state["step"]), int(state["total"])
    journal.record("resume", step=step, total=total)
    weights = torch.randn(args.size, args.size, device=device)

    while step < args.steps:
        step += 1
        if step in faults:
            journal.record("fault", kind=faults[step], step=step)
            os.kill(os.getpid(), signal.SIGKILL if faults[step] == "sigkill" else signal.SIGSTOP)
        product = weights @ weights
        value = torch.tensor([step * (rank + 1)], dtype=torch.int64, device=device)
        all_reduce_alive(value, client)
        total += int(value.item())  # .item() waits for the GPU
        del product
        time.sleep(args.step_time)
        client.send_heartbeat()
        journal.record("step", step=step, total=total, on=str(value.device))
        if step % args.checkpoint_every == 0:
            # Every rank has journalled this step before rank 0 saves it: a rank killed
            # between its all-reduce and its journal line leaves no checkpoint holding a
            # step it never recorded.
            all_reduce_alive(torch.ones(1, device=device), client)
            if rank == 0:
                write_atomic(checkpoint, json.dumps({"step": step, "total": total}))
                write_atomic(out / "progress", f"{step}\n")
                journal.record("checkpoint", step=step)

    dist.barrier()
    journal.record("done", step=step, total=total)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
