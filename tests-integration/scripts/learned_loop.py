"""A training loop's rhythm without torch, for learned timeouts (issue 27).

Heartbeats after each ``--step`` s step; every ``--save-every`` steps a save as long as
``--save-steps`` steps; every ``--validate-every`` steps a validation (a slow start,
then batches with heartbeats); every ``--epoch-steps`` steps an epoch boundary with a
slow data loader; at ``--slow-step`` one step ``--slow-factor`` times longer (a
recompilation). It notes saves, validations and epoch boundaries as a plain loop
does, with learned timeouts expecting a first save and validation. It runs until
``<out>/stop`` exists and appends ``ready``, ``learned`` (once active, with the
heartbeat timeout) and ``done`` to ``<out>/journal.jsonl``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

from _rank_journal import Journal

from nvrx.ft import RankMonitorClient


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--step", type=float, default=0.2)
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--save-steps", type=float, default=5.0)
    parser.add_argument("--validate-every", type=int, default=100)
    parser.add_argument("--epoch-steps", type=int, default=150)
    parser.add_argument("--epoch-boundary-steps", type=float, default=8.0)
    parser.add_argument("--slow-step", type=int, default=230)
    parser.add_argument("--slow-factor", type=float, default=10.0)
    args = parser.parse_args()
    journal = Journal(
        args.out / "journal.jsonl",
        rank=int(os.environ["RANK"]),
        attempt=int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
    )
    stop = args.out / "stop"
    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.enable_learned_timeouts(expect=["checkpoint", "validation"])
    journal.record("ready", pid=os.getpid())
    step = 0
    reported = False
    while not stop.exists():
        step += 1
        time.sleep(args.step * (args.slow_factor if step == args.slow_step else 1.0))
        client.send_heartbeat()
        if not reported and client.learned_timeouts_active:
            reported = True
            hb = client.hb_timeouts
            journal.record("learned", step=step, timeout=None if hb is None else hb.subsequent)
        if step % 10 == 0:
            journal.record("step", step=step)
        if step % args.save_every == 0:
            client.note_checkpoint_save()
            time.sleep(args.step * args.save_steps)
        if step % args.validate_every == 0:
            client.note_validation()
            time.sleep(args.step * 2)  # the validation data loader starts
            for _ in range(3):
                time.sleep(args.step / 2)
                client.send_heartbeat()
        if step % args.epoch_steps == 0:
            client.note_epoch_boundary()
            time.sleep(args.step * args.epoch_boundary_steps)
    hb = client.hb_timeouts
    journal.record("done", step=step, timeout=None if hb is None else hb.subsequent)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
