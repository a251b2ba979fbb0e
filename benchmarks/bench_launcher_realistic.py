"""ft_launcher: SIGKILL to first step on a realistic rank (env:// init, DDP, optimizer).

``benchmarks/scripts/realistic_rank.py`` does what a training script does before its
first step and stamps each part (imports, monitor client, process group, DDP, optimizer,
first step); the launcher's own phases (detect, stop, rendezvous, spawn) come from its
``--ft-cycle-log``. A 2-rank job on one node; rank 1 is SIGKILLed once the job trains.

- ``realistic_recovery_sigkill``: cold (each restart starts fresh Pythons).
- ``realistic_recovery_sigkill_warm``: ``--warm-spares`` (spares imported torch while the
  job trained; the fault comes once they are idle).
- ``realistic_recovery_sigkill_warm_preload``: the same, the spares also importing
  ``torch._dynamo`` (which DDP's constructor imports on first use) and ``nvrx.ft``
  ahead of time (``--warm-spare-preload``).
- ``realistic_start_floor``: the baseline, measured in the same run: the same rank
  script started twice by hand (no launcher, no monitor) over a ready TCPStore, to its
  first step. Each recovery's ``detail`` has its ratio to it.

Every phase figure is the median over restarts of the slowest rank's stamp minus the
previous phase's; ``*_spread_s`` is max minus min of the whole figure over the samples.
"""

from __future__ import annotations

import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Any

from _common import Metric
from _launcher_runs import bench_env, read_jsonl, reap, spares_idle, start_launcher, wait_for
from torch._C._distributed_c10d import TCPStore

__all__ = ["run"]

HERE = pathlib.Path(__file__).resolve().parent
RANK = HERE / "scripts" / "realistic_rank.py"
AREA = "launcher"
#: What a spare can import ahead of time beyond torch: DDP's constructor reads
#: ``torch._dynamo.utils.get_optimize_ddp_mode()`` (torch 2.13,
#: nn/parallel/distributed.py), and torch's lazy ``__getattr__`` imports
#: ``torch._dynamo`` (with sympy: some 800 modules) on that first touch.
PRELOAD = "torch,torch._dynamo,nvrx.ft"

#: The rank's stamps, in order; each phase ends at its stamp.
RANK_STAMPS = ("t_exec", "t_imports", "t_client", "t_pg", "t_ddp", "t_optim", "t_first_step")
#: The launcher's cycle-log times, in order.
LAUNCHER_STAMPS = ("failure_noticed", "workers_stopped", "rendezvous_done", "workers_started")
PHASES = {
    "detect_s": ("fault", "failure_noticed"),
    "stop_s": ("failure_noticed", "workers_stopped"),
    "rendezvous_s": ("workers_stopped", "rendezvous_done"),
    "spawn_s": ("rendezvous_done", "workers_started"),
    "exec_s": ("workers_started", "t_exec"),
    "imports_s": ("t_exec", "t_imports"),
    "monitor_client_s": ("t_imports", "t_client"),
    "process_group_s": ("t_client", "t_pg"),
    "ddp_setup_s": ("t_pg", "t_ddp"),
    "optimizer_s": ("t_ddp", "t_optim"),
    "first_step_s": ("t_optim", "t_first_step"),
}


def _phases_of(out: pathlib.Path, cycle: int, world: int) -> dict[str, float] | None:
    """The slowest rank's stamps of ``cycle``, once every rank has logged them."""
    rows = [e for e in read_jsonl(out / "events.jsonl") if e.get("event") == "phases"]
    rows = [e for e in rows if e["cycle"] == cycle]
    if len(rows) < world:
        return None
    return {name: max(float(e[name]) for e in rows) for name in RANK_STAMPS}


def _rank_pid(out: pathlib.Path, cycle: int, rank: int) -> int | None:
    for e in read_jsonl(out / "events.jsonl"):
        if e.get("event") == "start" and e["cycle"] == cycle and e["rank"] == rank:
            return int(e["pid"])
    return None


def _restart_record(cycles: pathlib.Path, cycle: int) -> dict[str, Any] | None:
    for row in read_jsonl(cycles):
        if row.get("cycle") == cycle and row.get("action") == "restart":
            return row
    return None


def _restarts(
    workdir: pathlib.Path, restarts: int, *, warm: bool, preload: str | None = None
) -> list[dict[str, float]]:
    """One launcher, 2 ranks; SIGKILL rank 1 ``restarts`` times; every stamp of each."""
    out = workdir / "out"
    out.mkdir(parents=True)
    cycles = workdir / "cycles.jsonl"
    cmd = [
        sys.executable, "-m", "nvrx.launcher", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", str(restarts), "--workers-stop-timeout", "5",
        "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "30",
        "--ft-rank-termination-grace-period", "2", "--ft-cycle-log", str(cycles),
        *(["--warm-spares"] if warm else []),
        *(["--warm-spare-preload", preload] if preload else []),
        str(RANK), "--out", str(out),
    ]  # fmt: skip
    launched = start_launcher(cmd, workdir / "launcher.log")
    samples: list[dict[str, float]] = []
    try:
        for cycle in range(restarts):
            wait_for(partial(_phases_of, out, cycle, 2), 180, f"training in cycle {cycle}")
            time.sleep(0.3)
            if warm:
                ranks = {int(e["pid"]) for e in read_jsonl(out / "events.jsonl") if "pid" in e}
                wait_for(partial(spares_idle, launched.pid, ranks, 2), 180, "idle spares")
            launched.remember_children()
            pid = wait_for(partial(_rank_pid, out, cycle, 1), 10, "rank 1's pid")
            fault = time.time()
            os.kill(pid, signal.SIGKILL)
            stamps = wait_for(partial(_phases_of, out, cycle + 1, 2), 180, "the restart")
            record = wait_for(partial(_restart_record, cycles, cycle), 30, "the cycle record")
            sample = {"fault": fault, **stamps}
            sample.update({name: float(record[name]) for name in LAUNCHER_STAMPS})
            samples.append(sample)
    finally:
        reap([launched])
    return samples


def _summary(samples: list[dict[str, float]], floor_s: float) -> tuple[float, dict[str, object]]:
    totals = [s["t_first_step"] - s["fault"] for s in samples]
    detail: dict[str, object] = {
        name: statistics.median(s[b] - s[a] for s in samples) for name, (a, b) in PHASES.items()
    }
    total = statistics.median(totals)
    detail["launcher_phases_s"] = statistics.median(
        s["workers_started"] - s["fault"] for s in samples
    )
    detail["rank_start_s"] = statistics.median(
        s["t_first_step"] - s["workers_started"] for s in samples
    )
    detail["spread_s"] = max(totals) - min(totals)
    detail["samples_s"] = [round(t, 3) for t in totals]
    detail["floor_s"] = floor_s
    detail["ratio_to_floor"] = total / floor_s
    return total, detail


def _floor_once(workdir: pathlib.Path) -> float:
    """Two fresh Pythons running the rank script by hand over a ready store: first step."""
    out = workdir / f"floor-{time.monotonic_ns()}"
    out.mkdir()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    start = time.time()
    procs = []
    try:
        for rank in range(2):
            env = bench_env(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(server.port),
                    "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_USE_AGENT_STORE": "True",
                }
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(RANK), "--out", str(out), "--no-monitor"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        stamps = wait_for(lambda: _phases_of(out, 0, 2), 120, "the floor's first step")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
    return stamps["t_first_step"] - start


def run(quick: bool) -> list[Metric]:
    """Cold, warm and warm-with-preload recovery on the realistic rank, and its floor."""
    restarts = 2 if quick else 4
    metrics: list[Metric] = []
    with tempfile.TemporaryDirectory(prefix="bench-realistic-") as tmp:
        work = pathlib.Path(tmp)
        floors = [_floor_once(work) for _ in range(2 if quick else 3)]
        runs: dict[str, list[dict[str, float]]] = {
            "": _restarts(work / "cold", restarts, warm=False)
        }
        floors.append(_floor_once(work))
        runs["_warm"] = _restarts(work / "warm", restarts, warm=True)
        runs["_warm_preload"] = _restarts(work / "preload", restarts, warm=True, preload=PRELOAD)
        floors.append(_floor_once(work))
        floor_s = statistics.median(floors)
        for suffix, samples in runs.items():
            total, detail = _summary(samples, floor_s)
            if suffix == "_warm_preload":
                detail["preload"] = PRELOAD
            name = f"realistic_recovery_sigkill{suffix}"
            metrics.append(Metric(AREA, name, total, "s", len(samples), None, detail))
        metrics.append(
            Metric(
                AREA,
                "realistic_start_floor",
                floor_s,
                "s",
                len(floors),
                None,
                {
                    "what": "2 Pythons: realistic_rank.py by hand to its first step",
                    "spread_s": max(floors) - min(floors),
                },
            )
        )
    for m in metrics:
        extra = ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.detail.items()
        )
        print(f"  {m.name}: {m.value:.3f} {m.unit} ({extra})", flush=True)
    return metrics
