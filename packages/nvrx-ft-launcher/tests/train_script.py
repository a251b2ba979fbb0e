"""A tiny data-parallel training job for the launcher tests and benchmark (gloo, CPU).

Each step all-reduces a tensor, sends a heartbeat to the rank's monitor and appends
a JSON line to ``<out>/events.jsonl``. Rank 0 checkpoints the step after every step
(atomically), every rank resumes from it, and the checkpointed step is mirrored to
``<out>/progress`` for the launcher's progress rule.

A fault is injected with ``--fault KIND:RANK:STEP[:CYCLE]``: on global rank RANK at
step STEP, in restart cycle CYCLE (default 0; ``*`` means every cycle), do KIND:
``sigkill``, ``raise``, ``exit`` (code 3), ``hang`` (SIGSTOP itself), ``desync``
(broadcast on another group while the others all-reduce), ``sleep`` (hang in
user code, outside any collective, where a stack dump still works), ``exclude`` or
``shutdown`` (workload control requests, then keep training), ``bad_error_file`` (write
garbage to the error file torch names, then exit 1).

``--record`` runs the entry point under torch's ``@record``, which writes an uncaught
exception and its traceback to that error file.

``--spawn-child`` makes each rank start a child process of its own (as a DataLoader
worker would) that sleeps; its pid is logged as a ``child`` event.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from nvrx.ft import RankMonitorClient, WorkloadAction, WorkloadControlRequest


def _log(out: pathlib.Path, **fields: object) -> None:
    fields.setdefault("t", time.time())
    line = json.dumps(fields) + "\n"
    fd = os.open(out / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _write_atomic(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fault_matches(spec: str | None, rank: int, step: int, cycle: int) -> str | None:
    if not spec:
        return None
    parts = spec.split(":")
    kind, f_rank, f_step = parts[0], int(parts[1]), int(parts[2])
    f_cycle = parts[3] if len(parts) > 3 else "0"
    if f_rank != rank or f_step != step:
        return None
    if f_cycle != "*" and int(f_cycle) != cycle:
        return None
    return kind


def _write_restore_record(ckpt: pathlib.Path | None, rank: int, cycle: int, step: int) -> None:
    """What a rank using local checkpoints tells its launcher it restored (the contract)."""
    from nvrx.ft.checkpointing.local import _contract as contract

    settings = contract.LocalCkptSettings.from_env()
    assert settings is not None, "the launcher gave no local checkpoint settings"
    contract.write_restore_record(
        settings.node_dir,
        contract.RestoreRecord(
            restart_count=cycle,
            rank=rank,
            local_rank=int(os.environ["LOCAL_RANK"]),
            source=contract.RestoreSource.OWN if ckpt else contract.RestoreSource.NONE,
            iteration=step if ckpt else None,
            snapshot_wall=ckpt.stat().st_mtime if ckpt else None,
            restore_s=0.01,
            wall=time.time(),
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--fault", default=None)
    parser.add_argument("--no-checkpoint", action="store_true")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit0-on-sigterm", action="store_true")
    parser.add_argument("--spawn-child", action="store_true")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--restore-record", action="store_true")
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.exit0_on_sigterm:
        # Like Lightning: a SIGTERM ends the rank "cleanly".
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    rank = int(os.environ["RANK"])
    cycle = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out: pathlib.Path = args.out
    _log(
        out,
        event="start",
        rank=rank,
        cycle=cycle,
        pid=os.getpid(),
        group_rank=int(os.environ["GROUP_RANK"]),
        world=int(os.environ["WORLD_SIZE"]),
    )
    if args.spawn_child:
        child = subprocess.Popen(  # fixed argv
            [sys.executable, "-c", "import time; time.sleep(600)", str(out)]
        )
        _log(out, event="child", rank=rank, cycle=cycle, pid=child.pid)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    # A desync: the faulty rank broadcasts on this group while the others all-reduce.
    side = dist.new_group() if args.fault and args.fault.startswith("desync:") else None

    ckpt = out / "checkpoint.json"
    start = 0
    if ckpt.exists() and not args.no_checkpoint:
        start = int(json.loads(ckpt.read_text())["step"])
    _log(out, event="resume", rank=rank, cycle=cycle, step=start)
    if args.restore_record:
        _write_restore_record(ckpt if start else None, rank, cycle, start)

    value = torch.ones(1)
    for step in range(start + 1, args.steps + 1):
        kind = _fault_matches(args.fault, rank, step, cycle)
        if kind == "sigkill":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "raise":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            raise RuntimeError(f"injected failure at step {step}")
        elif kind == "exit":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            sys.exit(3)
        elif kind == "bad_error_file":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            pathlib.Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text("{not json")
            sys.exit(1)
        elif kind == "hang":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "sleep":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            while True:
                time.sleep(0.5)
        elif kind == "desync":
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            dist.broadcast(value, src=rank, group=side)
        elif kind in ("exclude", "shutdown"):
            _log(out, event="fault", kind=kind, rank=rank, cycle=cycle, step=step)
            action = (
                WorkloadAction.ExcludeThisNode
                if kind == "exclude"
                else WorkloadAction.ShutdownWorkload
            )
            client.send_workload_control_request(WorkloadControlRequest(action, f"test {kind}"))

        dist.all_reduce(value)
        client.send_heartbeat()
        _log(out, event="step", rank=rank, cycle=cycle, step=step)
        if rank == 0 and not args.no_checkpoint:
            _write_atomic(ckpt, json.dumps({"step": step}))
            _write_atomic(out / "progress", f"{step}\n")
        time.sleep(args.step_time)

    dist.barrier()
    _log(out, event="done", rank=rank, cycle=cycle)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if "--record" in sys.argv:
        from torch.distributed.elastic.multiprocessing.errors import record

        sys.exit(record(main)())
    sys.exit(main())
