"""A tiny deterministic DDP job (gloo, CPU) for the fault matrix, run under ft_launcher.

Every step all-reduces ``step * (rank + 1)`` (heartbeating while it waits for the
peers, outside any section), adds the result to a running total, sends a heartbeat
(or runs that part inside the ``step`` section with ``--sections``), and
appends one JSON line to ``<out>/journal.jsonl``. Rank 0 checkpoints ``(step, total)``
every ``--checkpoint-every`` steps (atomically) and mirrors the step to
``<out>/progress`` for the launcher's progress rule; every attempt resumes from the
checkpoint. At the end rank 0 records the total, which equals
``world * (world + 1) / 2 * steps * (steps + 1) / 2`` exactly when every step was
applied once.

Faults: ``--fault KIND:RANK:STEP:ATTEMPT`` (repeatable; ATTEMPT is an integer or
``*`` for every attempt) makes global rank RANK do KIND just before step STEP (step
0: right after connecting to its monitor, before the first heartbeat):

- ``sigkill``: SIGKILL itself;  ``raise``: raise RuntimeError;  ``exit``: exit code 7;
- ``sigstop``: SIGSTOP itself (a hang the monitor must notice);
- ``hang``: sleep forever;  ``hang_ignoring_sigterm``: ignore SIGTERM, then sleep forever;
- ``hang_in_section``: open the ``step`` section, then sleep forever;
- ``hang_exiting_0_on_sigterm``: exit 0 on SIGTERM (as Lightning's handler does), then
  sleep forever.
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

KINDS = (
    "sigkill",
    "raise",
    "exit",
    "sigstop",
    "hang",
    "hang_ignoring_sigterm",
    "hang_in_section",
    "hang_exiting_0_on_sigterm",
)


def parse_fault(spec: str) -> tuple[str, int, int, str]:
    kind, rank, step, attempt = spec.split(":")
    if kind not in KINDS:
        raise SystemExit(f"--fault: unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return kind, int(rank), int(step), attempt


def hang_forever() -> None:
    while True:
        time.sleep(1.0)


def inject(kind: str, client: RankMonitorClient) -> None:
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "raise":
        raise RuntimeError("injected fault: exception in the training step")
    elif kind == "exit":
        sys.exit(7)
    elif kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "hang":
        hang_forever()
    elif kind == "hang_ignoring_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        hang_forever()
    elif kind == "hang_exiting_0_on_sigterm":
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
        hang_forever()
    elif kind == "hang_in_section":
        client.start_section("step")
        hang_forever()


def all_reduce_alive(value: torch.Tensor, client: RankMonitorClient, heartbeats: bool) -> None:
    """All-reduce, heartbeating while a peer keeps us waiting (outside any section).

    So a healthy rank is never taken for hung because a peer is: only the faulty
    rank's monitor acts, and the restart cause names that rank.
    """
    work = dist.all_reduce(value, async_op=True)
    assert work is not None
    while not work.is_completed():
        if heartbeats:
            client.send_heartbeat()
        time.sleep(0.005)
    work.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--sections", action="store_true", help="sections instead of heartbeats")
    parser.add_argument("--record-sigterm", action="store_true")
    parser.add_argument("--fault", action="append", default=[], type=parse_fault)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out: pathlib.Path = args.out
    journal = Journal(out / "journal.jsonl", rank=rank, attempt=attempt)
    journal.record("start", pid=os.getpid(), world=int(os.environ["WORLD_SIZE"]))
    if args.record_sigterm:

        def on_sigterm(signum: int, frame: object) -> None:
            journal.record("sigterm")
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    faults = {
        step: kind
        for kind, f_rank, step, f_attempt in args.fault
        if f_rank == rank and f_attempt in ("*", str(attempt))
    }
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    # Connect after the process group is up, so the initial heartbeat timeout only has
    # to cover the step below, not torch's start-up under load.
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if 0 in faults:
        journal.record("fault", kind=faults[0], step=0)
        inject(faults[0], client)
    if not args.sections:
        client.send_heartbeat()

    checkpoint = out / "checkpoint.json"
    step, total = 0, 0
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        step, total = int(state["step"]), int(state["total"])
    journal.record("resume", step=step, total=total)

    while step < args.steps:
        step += 1
        if step in faults:
            journal.record("fault", kind=faults[step], step=step)
            inject(faults[step], client)
        value = torch.tensor([step * (rank + 1)], dtype=torch.int64)
        all_reduce_alive(value, client, heartbeats=not args.sections)
        if args.sections:
            client.start_section("step")
        total += int(value.item())
        time.sleep(args.step_time)
        if args.sections:
            client.end_section("step")
        else:
            client.send_heartbeat()
        journal.record("step", step=step, total=total)
        if step % args.checkpoint_every == 0 and rank == 0:
            write_atomic(checkpoint, json.dumps({"step": step, "total": total}))
            write_atomic(out / "progress", f"{step}\n")
            journal.record("checkpoint", step=step)

    dist.barrier()
    journal.record("done", step=step, total=total, world=world)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
