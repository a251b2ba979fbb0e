"""A rank for the soak test: heartbeats at about 1 kHz until ``<out>/stop`` appears.

No torch: the soak exercises the launcher and the monitors (detection, decisions,
restarts, reaping), so each restart should cost them, not ``import torch``. Each rank
appends ``ready`` (after its first heartbeat, with its pid and attempt) and ``done`` to
``<out>/journal.jsonl`` and logs how many heartbeats it sent.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

from nvrx.ft import RankMonitorClient


def _record(out: pathlib.Path, **fields: object) -> None:
    line = json.dumps({**fields, "t": time.time()}) + "\n"
    fd = os.open(out / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--interval", type=float, default=0.001)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    stop = args.out / "stop"
    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()
    _record(args.out, event="ready", rank=rank, attempt=attempt, pid=os.getpid())
    sent = 1
    started = time.monotonic()
    while True:
        client.send_heartbeat()
        sent += 1
        if sent % 100 == 0 and stop.exists():
            break
        time.sleep(args.interval)
    rate = sent / (time.monotonic() - started)
    _record(args.out, event="done", rank=rank, attempt=attempt, heartbeats=sent, rate_hz=rate)
    client.shutdown_workload_monitoring()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
