"""A rank for the cluster-feature tests: says what it was given, and fails on request.

Prints (to stdout) its RANK, GROUP_RANK and the cycle info it reads through
``nvrx.ft.read_cycle_info()`` (NVRX_CURRENT_CYCLE_INFO), appends the same as one JSON
line to ``<out>/ranks.jsonl``, heartbeats its monitor, then:

- ``--fail-rank R --fail-cycle C``: global rank R exits 3 in cycle C (after
  ``--fail-after`` seconds of heartbeats); ``--fail-world-size N`` instead of
  ``--fail-cycle``: in every cycle whose WORLD_SIZE is N (a test that cannot know which
  cycle first has every node, when a late node's join costs a restart);
- on SIGTERM it prints a last line to stdout and stderr and exits 143 (the per-cycle
  log test checks that line survived the launcher's SIGTERM);
- otherwise it sleeps ``--seconds`` (heartbeating) and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import time
from types import FrameType

from nvrx.ft import RankMonitorClient, read_cycle_info


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    rank = os.environ.get("RANK")
    print(f"rank {rank} got SIGTERM: last stdout line", flush=True)
    print(f"rank {rank} got SIGTERM: last stderr line", file=sys.stderr, flush=True)
    os._exit(143)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-cycle", type=int, default=0)
    parser.add_argument("--fail-after", type=float, default=0.0)
    parser.add_argument("--fail-world-size", type=int, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    rank = int(os.environ["RANK"])
    cycle = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    info = read_cycle_info()
    said = {
        "rank": rank,
        "group_rank": int(os.environ["GROUP_RANK"]),
        "cycle": cycle,
        "cycle_info_env": os.environ.get("NVRX_CURRENT_CYCLE_INFO"),
        "cycle_info_cycle": None if info is None else info.cycle,
        "cycle_info_cause": None if info is None else info.cause,
        "pid": os.getpid(),
    }
    print(json.dumps(said), flush=True)
    fd = os.open(args.out / "ranks.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (json.dumps(said) + "\n").encode())
    os.close(fd)
    client = RankMonitorClient()
    client.init_workload_monitoring()
    if args.fail_world_size:
        failing_cycle = int(os.environ["WORLD_SIZE"]) == args.fail_world_size
    else:
        failing_cycle = cycle == args.fail_cycle
    if rank == args.fail_rank and failing_cycle:
        _heartbeat(client, args.fail_after)
        print(f"rank {rank} fails on purpose in cycle {cycle}", file=sys.stderr, flush=True)
        return 3
    _heartbeat(client, args.seconds)
    client.shutdown_workload_monitoring()
    return 0


def _heartbeat(client: RankMonitorClient, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client.send_heartbeat()
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
