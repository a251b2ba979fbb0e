"""A scripted training rank for the tests: ``python rank_worker.py '<json list of steps>'``.

Each step is ``[name, *args]``: init [WARMUP_ITERS], hb, open NAME, try_open NAME, close NAME,
steps N SECONDS, fork_init, nondaemon_thread, raise, close_all, sleep S,
beat_for S INTERVAL, ignore_sigterm, say TEXT, say_wall TEXT, hang, spin, stop_self, shutdown,
calc_hb,
calc_sections, load_state JSON, print_state, dist_init, dist_barrier,
spawn_child, fork_sleeper, train STEPS SECONDS, control ACTION,
exit CODE. Markers go to stdout; the stack dump to stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from nvrx.ft import (
    RankMonitorClient,
    RankMonitorClientError,
    WorkloadAction,
    WorkloadControlRequest,
)


def main() -> int:
    steps = json.loads(sys.argv[1])
    client = RankMonitorClient()
    for step in steps:
        name, args = step[0], step[1:]
        if name == "init":
            if args:
                client.init_workload_monitoring(num_warmup_iters=args[0])
            else:
                client.init_workload_monitoring()
        elif name == "hb":
            client.send_heartbeat()
        elif name == "open":
            client.start_section(args[0])
        elif name == "try_open":
            try:
                client.start_section(args[0])
            except RankMonitorClientError as exc:
                print(f"refused: {exc}", flush=True)
            else:
                print(f"opened {args[0]}", flush=True)
        elif name == "steps":  # N steps of SECONDS each, marking each start
            for i in range(int(args[0])):
                print(f"step {i + 1}", flush=True)
                client.start_section("step")
                time.sleep(args[1])
                client.end_section("step")
        elif name == "fork_init":  # a child (as a DataLoader worker) runs the same init
            forked = os.fork()
            if forked == 0:
                try:
                    RankMonitorClient().init_workload_monitoring()
                except RankMonitorClientError as exc:
                    print(f"child refused: {exc}", flush=True)
                else:
                    print("child accepted", flush=True)
                os._exit(0)
            os.waitpid(forked, 0)
        elif name == "nondaemon_thread":  # would keep a normal interpreter exit waiting
            import threading

            threading.Thread(target=time.sleep, args=(600,), daemon=False).start()
        elif name == "raise":
            raise RuntimeError("boom from the test")
        elif name == "close":
            client.end_section(args[0])
        elif name == "close_all":
            client.end_all_sections()
        elif name == "sleep":
            time.sleep(args[0])
        elif name == "beat_for":
            end = time.monotonic() + args[0]
            while time.monotonic() < end:
                client.send_heartbeat()
                time.sleep(args[1])
        elif name == "ignore_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif name == "say":
            print(args[0], flush=True)
        elif name == "say_wall":  # TEXT and the wall time now
            print(f"{args[0]} {time.time():.6f}", flush=True)
        elif name == "spin":  # busy forever: state R
            while True:
                pass
        elif name == "hang":
            while True:
                time.sleep(1)
        elif name == "stop_self":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif name == "shutdown":
            client.shutdown_workload_monitoring()
        elif name == "control":
            client.send_workload_control_request(
                WorkloadControlRequest(WorkloadAction[args[0]], "from the test")
            )
        elif name == "load_state":
            client.load_state_dict(json.loads(args[0]))
        elif name == "print_state":
            print("STATE " + json.dumps(client.state_dict(), sort_keys=True), flush=True)
        elif name == "calc_hb":
            print(f"calc_hb {client.calculate_and_set_hb_timeouts()}", flush=True)
        elif name == "calc_sections":
            print(f"calc_sections {client.calculate_and_set_section_timeouts()}", flush=True)
        elif name == "dist_init":
            import torch.distributed as dist

            dist.init_process_group("gloo")
        elif name == "dist_barrier":
            import torch.distributed as dist

            dist.barrier()
        elif name == "spawn_child":
            import subprocess

            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            print(f"child {child.pid}", flush=True)
        elif name == "fork_sleeper":
            forked = os.fork()
            if forked == 0:  # holds the control socket and the shared block open
                time.sleep(120)
                os._exit(0)
            print(f"forked {forked}", flush=True)
        elif name == "train":  # steps, seconds per step: heartbeat after each all-reduce
            import torch
            import torch.distributed as dist

            for _ in range(int(args[0])):
                dist.all_reduce(torch.ones(4))
                client.send_heartbeat()
                time.sleep(args[1])
        elif name == "learn":  # enable learned timeouts, expecting these kinds
            client.enable_learned_timeouts(list(args))
        elif name == "note":  # checkpoint, validation or epoch
            getattr(
                client,
                {
                    "checkpoint": "note_checkpoint_save",
                    "validation": "note_validation",
                    "epoch": "note_epoch_boundary",
                }[args[0]],
            )()
        elif name == "beats":  # N heartbeats SECONDS apart
            for _ in range(int(args[0])):
                time.sleep(args[1])
                client.send_heartbeat()
        elif name == "say_learned":
            print(f"learned {client.learned_timeouts_active} {client.hb_timeouts}", flush=True)
        elif name == "exit":
            return int(args[0])
        else:
            raise SystemExit(f"unknown step {name!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
