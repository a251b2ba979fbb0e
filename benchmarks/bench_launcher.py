"""ft_launcher: recovery latency after a crash and a hang, and overhead against torchrun.

- ``recovery_sigkill``: a 2-rank gloo job on one node; a rank is SIGKILLed and we time
  from the kill to the first training step after the restart, split into detect, stop,
  rendezvous, spawn (from the launcher's --ft-cycle-log) and first step (from the
  training script's own log: Python start, import torch, process group, one step).
- ``bare_start``: the floor under any restart: two fresh Pythons importing torch and
  creating a gloo process group, up to their first all-reduce. ``launcher_added_s`` is
  recovery minus this floor.
- ``recovery_hang_beyond_timeout``: a rank is SIGSTOPped; time from the moment its
  heartbeat timeout elapsed to the first training step after the restart.
- ``..._warm``: the same with ``--warm-spares``: the new ranks are spares that imported
  torch while the job trained (the fault comes once they are idle, as a failure hours
  into a run would), so the floor above no longer applies.
- ``overhead_vs_torchrun``: wall time of ``ft_launcher --standalone --nproc-per-node 2``
  over ``torchrun`` on the same script that exits at once.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import Metric
from _launcher_runs import bench_env, read_jsonl, spares_idle, wait_for
from torch._C._distributed_c10d import TCPStore

__all__ = ["run"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = ROOT / "packages" / "nvrx-ft-launcher" / "tests" / "train_script.py"
AREA = "launcher"
HEARTBEAT_TIMEOUT = 2.0

_BARE = """
import datetime, sys, time, torch, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=int(sys.argv[2]), world_size=2)
t = torch.ones(1)
dist.all_reduce(t)
print(time.time(), flush=True)
dist.destroy_process_group()
"""


def _events(out: pathlib.Path) -> list[dict[str, Any]]:
    return read_jsonl(out / "events.jsonl")


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _first_step(out: pathlib.Path, cycle: int) -> float | None:
    steps = [e["t"] for e in _events(out) if e["event"] == "step" and e["cycle"] == cycle]
    return max(steps) if len(steps) >= 2 else None


def _restart_job(
    workdir: pathlib.Path, fault: str, restarts: int, *, warm: bool = False
) -> tuple[list[dict[str, float]], str]:
    """Run one launcher; inject ``fault`` into rank 1 ``restarts`` times; time each."""
    out = workdir / "out"
    out.mkdir()
    cycles = workdir / "cycles.jsonl"
    log = (workdir / "launcher.log").open("wb")
    cmd = [
        sys.executable, "-m", "nvrx.launcher", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", str(restarts), "--workers-stop-timeout", "5",
        "--ft-rank-heartbeat-timeout", str(HEARTBEAT_TIMEOUT),
        "--ft-initial-rank-heartbeat-timeout", "120",
        "--ft-rank-termination-grace-period", "2", "--ft-cycle-log", str(cycles),
        *(["--warm-spares"] if warm else []),
        str(TRAIN), "--out", str(out), "--steps", "1000000", "--step-time", "0.02",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=bench_env())
    samples: list[dict[str, float]] = []
    try:
        for cycle in range(restarts):
            wait_for(functools.partial(_first_step, out, cycle), 120, f"training in cycle {cycle}")
            time.sleep(0.3)  # a few steps, so the heartbeat timeout is armed
            if warm:
                ranks = {e["pid"] for e in _events(out) if e["event"] == "start"}
                wait_for(
                    functools.partial(spares_idle, proc.pid, ranks, 2), 120, "idle warm spares"
                )
            pid = next(
                e["pid"]
                for e in _events(out)
                if e["event"] == "start" and e["cycle"] == cycle and e["rank"] == 1
            )
            fault_time = time.time()
            os.kill(pid, signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)
            first = wait_for(
                functools.partial(_first_step, out, cycle + 1), 120, "the restarted job"
            )
            record = next(
                r
                for r in map(json.loads, cycles.read_text().splitlines())
                if r["cycle"] == cycle and r["action"] == "restart"
            )
            last_beat = max(
                e["t"]
                for e in _events(out)
                if e["event"] == "step"
                and e["cycle"] == cycle
                and e["rank"] == 1
                and e["t"] < fault_time
            )
            samples.append(
                {
                    "fault": fault_time,
                    "last_heartbeat": last_beat,
                    "noticed": record["failure_noticed"],
                    "stopped": record["workers_stopped"],
                    "rendezvous": record["rendezvous_done"],
                    "started": record["workers_started"],
                    "first_step": first,
                }
            )
    finally:
        _kill_tree(proc)
        log.close()
    return samples, (workdir / "launcher.log").read_text(errors="replace")


def _breakdown(samples: list[dict[str, float]], origin: str) -> dict[str, float]:
    def med(a: str, b: str) -> float:
        return statistics.median(s[b] - s[a] for s in samples)

    return {
        "detect_s": med(origin, "noticed"),
        "stop_s": med("noticed", "stopped"),
        "rendezvous_s": med("stopped", "rendezvous"),
        "spawn_s": med("rendezvous", "started"),
        "first_step_s": med("started", "first_step"),
        # Everything the launcher itself does between the fault and the new ranks.
        "launcher_phases_s": med(origin, "started"),
    }


def _bare_start() -> float:
    """Seconds for 2 fresh Pythons to import torch, form a gloo group and all-reduce.

    The store is up before they start, as the launcher's is for its ranks.
    """
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    start = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BARE, str(server.port), str(rank)],
            stdout=subprocess.PIPE,
            env=bench_env(),
        )
        for rank in range(2)
    ]
    done = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=120)
        done.append(float(stdout.split()[0]))
    return max(done) - start


def _wall(cmd: list[str], cwd: pathlib.Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        cmd,
        cwd=cwd,
        env=bench_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def _overhead(samples: int, workdir: pathlib.Path) -> tuple[float, float]:
    script = workdir / "exit_at_once.py"
    script.write_text("pass\n")
    common = ["--standalone", "--nproc-per-node", "2", str(script)]
    ours, theirs = [], []
    _wall([sys.executable, "-m", "nvrx.launcher", *common], workdir)  # warm the page cache
    for _ in range(samples):
        theirs.append(_wall([sys.executable, "-m", "torch.distributed.run", *common], workdir))
        ours.append(_wall([sys.executable, "-m", "nvrx.launcher", *common], workdir))
    return statistics.median(ours), statistics.median(theirs)


def _recovery(work: pathlib.Path, quick: bool, *, warm: bool) -> list[Metric]:
    """Recovery after SIGKILL and beyond the timeout after SIGSTOP, cold or warm."""
    suffix = "_warm" if warm else ""
    restarts = 2 if quick else 5
    hangs = 1 if quick else 3
    (work / f"kill{suffix}").mkdir()
    kills, _ = _restart_job(work / f"kill{suffix}", "sigkill", restarts, warm=warm)
    recovery = statistics.median(s["first_step"] - s["fault"] for s in kills)
    detail: dict[str, object] = dict(_breakdown(kills, "fault"))

    (work / f"hang{suffix}").mkdir()
    stops, _ = _restart_job(work / f"hang{suffix}", "sigstop", hangs, warm=warm)
    for s in stops:
        s["timeout_elapsed"] = s["last_heartbeat"] + HEARTBEAT_TIMEOUT
    beyond = statistics.median(s["first_step"] - s["timeout_elapsed"] for s in stops)
    hang_detail: dict[str, object] = dict(_breakdown(stops, "timeout_elapsed"))
    hang_detail["heartbeat_timeout_s"] = HEARTBEAT_TIMEOUT
    return [
        Metric(AREA, f"recovery_sigkill{suffix}", recovery, "s", len(kills), 2.0, detail),
        Metric(
            AREA,
            f"recovery_hang_beyond_timeout{suffix}",
            beyond,
            "s",
            len(stops),
            2.5,
            hang_detail,
        ),
    ]


def run(quick: bool) -> list[Metric]:
    """Measure recovery (cold and warm), the bare start floor, and overhead."""
    overhead_samples = 3 if quick else 7
    metrics: list[Metric] = []
    with tempfile.TemporaryDirectory(prefix="bench-launcher-") as tmp:
        work = pathlib.Path(tmp)
        # The floor is sampled around the cold jobs, as the machine's load drifts.
        bare = [_bare_start() for _ in range(2 if quick else 3)]
        cold = _recovery(work, quick, warm=False)
        bare += [_bare_start() for _ in range(1 if quick else 2)]
        bare_s = statistics.median(bare)
        for metric in cold:
            # Beyond the floor: launcher phases plus whatever the new ranks spend over
            # it (exec shim, monitor client init); noisy on a loaded machine.
            metric.detail["bare_start_s"] = bare_s
            metric.detail["launcher_added_s"] = metric.value - bare_s
        metrics += cold
        metrics.append(
            Metric(
                AREA,
                "bare_start_floor",
                bare_s,
                "s",
                len(bare),
                None,
                {"what": "2 Pythons: import torch + gloo process group + 1 all-reduce"},
            )
        )
        metrics += _recovery(work, quick, warm=True)

        ours, theirs = _overhead(overhead_samples, work)
        metrics.append(
            Metric(
                AREA,
                "overhead_vs_torchrun",
                ours / theirs,
                "x",
                overhead_samples,
                1.15,
                {"ft_launcher_s": ours, "torchrun_s": theirs},
            )
        )
    for m in metrics:
        extra = ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.detail.items()
        )
        print(f"  {m.name}: {m.value:.3f} {m.unit} ({extra})", flush=True)
    return metrics
