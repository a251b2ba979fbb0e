"""A realistic rank for the restart benchmark: env:// init, a small model in DDP, an optimizer.

What a real training script does before its first step, each part stamped with wall-clock
time so the benchmark can say where a restart's seconds go. One ``phases`` line per rank
and cycle goes to ``<out>/events.jsonl``:

``t_exec`` (the script's first line; for a warm spare, when it became the rank),
``t_imports`` (torch, torch.nn, DDP, torch.optim imported), ``t_client`` (nvrx.ft's
monitor client connected), ``t_pg`` (``init_process_group("gloo")`` from env://),
``t_ddp`` (model built and wrapped in DDP: parameters broadcast from rank 0),
``t_optim`` (optimizer built), ``t_first_step`` (forward, backward with DDP's gradient
all-reduce, optimizer step, for the first batch).

Then it trains: a ``step`` line per step, a heartbeat per step, rank 0 checkpoints the
step number, until the launcher stops it. With ``--no-monitor`` (a run outside
``ft_launcher``, the benchmark's baseline) there is no monitor client and ``t_client``
is ``t_imports``.
"""

import time

T_EXEC = time.time()

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.optim as optim  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

T_IMPORTS = time.time()

from nvrx.ft import RankMonitorClient  # noqa: E402


def _log(out: pathlib.Path, **fields: object) -> None:
    fields.setdefault("t", time.time())
    fd = os.open(out / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def _model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-time", type=float, default=0.02)
    parser.add_argument("--no-monitor", action="store_true")
    args = parser.parse_args()
    out: pathlib.Path = args.out
    rank = int(os.environ["RANK"])
    cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    _log(out, event="start", rank=rank, cycle=cycle, pid=os.getpid())

    client = None if args.no_monitor else RankMonitorClient()
    if client is not None:
        client.init_workload_monitoring()
    t_client = time.time()
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    t_pg = time.time()
    torch.manual_seed(0)
    model = DistributedDataParallel(_model(args.width, args.depth))
    t_ddp = time.time()
    optimizer = optim.AdamW(model.parameters(), lr=1e-3)
    t_optim = time.time()

    ckpt = out / "checkpoint.json"
    step = int(json.loads(ckpt.read_text())["step"]) if ckpt.exists() else 0
    generator = torch.Generator().manual_seed(rank)
    loss_fn = nn.CrossEntropyLoss()
    first = True
    while True:
        step += 1
        inputs = torch.randn(args.batch, args.width, generator=generator)
        labels = torch.randint(0, 10, (args.batch,), generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), labels).backward()
        optimizer.step()
        if client is not None:
            client.send_heartbeat()
        now = time.time()
        if first:
            first = False
            _log(
                out,
                event="phases",
                rank=rank,
                cycle=cycle,
                t_exec=T_EXEC,
                t_imports=T_IMPORTS,
                t_client=t_client,
                t_pg=t_pg,
                t_ddp=t_ddp,
                t_optim=t_optim,
                t_first_step=now,
            )
        _log(out, event="step", rank=rank, cycle=cycle, step=step, t=now)
        if rank == 0:
            tmp = ckpt.with_name(f".{ckpt.name}.tmp")
            tmp.write_text(json.dumps({"step": step}))
            os.replace(tmp, ckpt)
        time.sleep(args.step_time)


if __name__ == "__main__":
    main()
