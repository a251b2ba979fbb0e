"""A training loop shaped like Megatron-LM's fault tolerance integration (gloo, CPU).

Written from Megatron-LM's documented call shapes (``megatron/training/ft_integration.py``),
not its code: ``RankMonitorClient()``; the FT state of the previous job loaded from
``<out>/ft_state.json`` with ``load_state_dict`` before
``init_workload_monitoring(num_warmup_iters=N)``; sections ``setup`` (loading the
checkpoint), ``step`` (each iteration) and ``checkpointing`` (each save); at the end
``calculate_and_set_section_timeouts(selected_sections=[...], calc_out_of_section=False)``
and ``state_dict()`` saved to ``<out>/ft_state.json`` by rank 0.

The first ``--slow-steps`` steps of attempt 0 take ``--slow-time`` seconds each, longer
than the ``step`` timeout: warmup-aware checking must let them pass. ``--hang
RANK:STEP:ATTEMPT`` makes a rank hang inside the ``step`` section; ``--exit-after-save
RANK:ATTEMPT`` makes a rank exit 7 right after the FT state was saved (so the next
attempt loads it). Each rank appends JSON lines to ``<out>/journal.jsonl``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from _rank_journal import Journal, write_atomic

from nvrx.ft import RankMonitorClient

SECTIONS = ["setup", "step", "checkpointing"]


def _triple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(":"))


def _timeouts(client: RankMonitorClient) -> dict[str, Any]:
    timeouts = client.section_timeouts
    assert timeouts is not None
    return {
        "section": dict(timeouts.section),
        "out_of_section": timeouts.out_of_section,
        "calculated_sections": sorted(timeouts.calculated_sections),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--warmup-iters", type=int, default=2)
    parser.add_argument("--slow-steps", type=int, default=2)
    parser.add_argument("--slow-time", type=float, default=4.0)
    parser.add_argument("--hang", type=_triple, default=None)
    parser.add_argument("--exit-after-save", type=_triple, default=None)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    out: pathlib.Path = args.out
    journal = Journal(out / "journal.jsonl", rank=rank, attempt=attempt)
    state_file = out / "ft_state.json"

    client = RankMonitorClient()
    loaded = None
    if state_file.exists():
        loaded = json.loads(state_file.read_text())
        client.load_state_dict(loaded)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    client.init_workload_monitoring(num_warmup_iters=args.warmup_iters)
    journal.record("init", loaded=loaded is not None, timeouts=_timeouts(client))

    client.start_section("setup")
    checkpoint = out / "checkpoint.json"
    step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
    client.end_section("setup")
    journal.record("resume", step=step)

    while step < args.steps:
        step += 1
        if args.hang == (rank, step, attempt):
            journal.record("fault", kind="hang_in_section", step=step)
            client.start_section("step")
            while True:
                time.sleep(1.0)
        value = torch.tensor([step], dtype=torch.int64)
        dist.all_reduce(value)
        client.start_section("step")
        slow = attempt == 0 and step <= args.slow_steps
        time.sleep(args.slow_time if slow else 0.02)
        client.end_section("step")
        journal.record("step", step=step, slow=slow)
        if step % args.checkpoint_every == 0:
            client.start_section("checkpointing")
            if rank == 0:
                write_atomic(checkpoint, json.dumps({"step": step}))
            dist.barrier()
            client.end_section("checkpointing")

    calculated = client.calculate_and_set_section_timeouts(
        selected_sections=SECTIONS, calc_out_of_section=False, skip_if_not_ready=True
    )
    state = client.state_dict()
    if rank == 0:
        write_atomic(state_file, json.dumps(state))
    journal.record("saved", calculated=calculated, state=state, timeouts=_timeouts(client))
    dist.barrier()
    if args.exit_after_save == (rank, attempt):
        journal.record("fault", kind="exit_after_save", step=step)
        sys.exit(7)
    dist.barrier()
    journal.record("done", step=step)
    client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
