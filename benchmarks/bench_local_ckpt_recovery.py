"""A fault -> training back at the step the fault hit: disk checkpoints vs local snapshots.

One ``ft_launcher`` with two DDP ranks (gloo, AdamW,
``tests-integration/scripts/local_ckpt_ddp.py``): rank 0 writes a disk checkpoint every
``K`` steps (what users have today) and, with local checkpoints on, every rank takes a
local snapshot every step (``--local-ckpt-every-n-steps 1``, a base directory on
``/dev/shm`` where there is one). Once the job trains, the benchmark hits rank 1 halfway
between two disk checkpoints (the average case) with

- a crash: SIGKILL;
- a hang: SIGSTOP, found by the rank's monitor (``--ft-rank-heartbeat-timeout`` 3 s);

and measures the wall time from the fault until rank 1 finishes the step the fault hit
again (``back_s``), cold and with ``--warm-spares`` (the fault waits for the spares to
be idle). ``recomputed_steps`` is how many steps the job ran twice: about K/2 with disk
checkpoints, at most one with local snapshots. The restart itself (detection, stop,
rendezvous, start, restore) is the same for both; the difference is the recomputed
work, which here is K/2 x the step time and in real jobs half the disk interval
(minutes).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import statistics
import sys
import tempfile
import time
from functools import partial
from typing import Any

from _common import Metric
from _launcher_runs import (
    Launched,
    bench_env,
    read_jsonl,
    reap,
    spares_idle,
    start_launcher,
    wait_for,
)

__all__ = ["run"]

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE.parent / "tests-integration" / "scripts" / "local_ckpt_ddp.py"
AREA = "local_ckpt_recovery"
STEP_S = 0.25
DISK_EVERY = 20
HEARTBEAT_TIMEOUT_S = 3.0


def _steps(out: pathlib.Path, rank: int, attempt: int) -> list[dict[str, Any]]:
    return [
        e
        for e in read_jsonl(out / "journal.jsonl")
        if e.get("event") == "step" and e["rank"] == rank and e["attempt"] == attempt
    ]


def _event(out: pathlib.Path, kind: str, rank: int, attempt: int) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in read_jsonl(out / "journal.jsonl")
            if e.get("event") == kind and e["rank"] == rank and e["attempt"] == attempt
        ),
        None,
    )


def _at_fault_point(out: pathlib.Path, warm: Launched | None) -> int | None:
    """The last step rank 1 journalled, once it is halfway between disk checkpoints."""
    steps = _steps(out, 1, 0)
    last = steps[-1]["step"] if steps else 0
    if last < DISK_EVERY + DISK_EVERY // 2 or last % DISK_EVERY != DISK_EVERY // 2:
        return None
    if warm is not None:
        pids = {e["pid"] for e in read_jsonl(out / "journal.jsonl") if e.get("event") == "start"}
        if not spares_idle(warm.pid, pids, 2):
            return None
    return int(last)


def _sample(work: pathlib.Path, *, local: bool, fault: str, warm: bool) -> dict[str, float]:
    out = work / "out"
    out.mkdir(parents=True)
    base = pathlib.Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else work
    base = base / f"nvrx-bench-{os.getpid()}-{work.name}"
    base.mkdir()
    journal = work / "launcher.jsonl"
    cmd = [
        sys.executable, "-m", "nvrx.launcher",
        "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
        "--monitor-interval", "0.1", "--workers-stop-timeout", "5",
        "--ft-initial-rank-heartbeat-timeout", "300",
        "--ft-rank-heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S),
        "--ft-rank-termination-grace-period", "1",
        "--ft-journal", str(journal),
        "--local-ckpt-dir", str(base) if local else "none",
        "--local-ckpt-every-n-steps", "1",
        *(["--warm-spares"] if warm else []),
        str(SCRIPT), "--out", str(out), "--steps", "100000",
        "--step-time", str(STEP_S), "--disk-every", str(DISK_EVERY),
        *([] if local else ["--no-local"]),
    ]  # fmt: skip
    launched = [start_launcher(cmd, work / "launcher.log", env=bench_env())]
    try:
        last = wait_for(
            partial(_at_fault_point, out, launched[0] if warm else None), 600, "the fault point"
        )
        victim = _event(out, "start", 1, 0)
        assert victim is not None
        launched[0].remember_children()
        done = _steps(out, 1, 0)  # read again: the spares' check took a few steps
        t_fault = time.time()
        os.kill(int(victim["pid"]), signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
        last = max(last, int(done[-1]["step"]))
        restored = wait_for(partial(_event, out, "restored", 1, 1), 600, "the restore record")
        # The step the fault hit: the one after the last rank 1 journalled, or after the
        # snapshot it restored (a step it finished but had not journalled yet).
        hit = max(last, int(restored["step"])) + 1
        back = wait_for(
            lambda: next((e for e in _steps(out, 1, 1) if e["step"] >= hit), None),
            600,
            "rank 1 back at the step the fault hit",
        )
        first = _steps(out, 1, 1)[0]
    finally:
        reap(launched)
        shutil.rmtree(base, ignore_errors=True)
    costs = [r for r in read_jsonl(journal) if r.get("event") == "restart"]
    return {
        "back_s": float(back["t"]) - t_fault,
        "recomputed_steps": float(hit - 1 - int(restored["step"])),
        "restart_to_first_step_s": float(first["t"]) - t_fault,
        "restore_s": float(restored["restore_s"]),
        "launcher_restart_s": float(costs[0]["total_s"]) if costs else float("nan"),
    }


def run(quick: bool) -> list[Metric]:
    """Each fault, storage and start mode; ``samples`` jobs each, interleaved."""
    samples = 1 if quick else 2
    cases = [
        (fault, local, warm)
        for fault in ("crash", "hang")
        for warm in (False, True)
        for local in (False, True)
    ]
    measured: dict[tuple[str, bool, bool], list[dict[str, float]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench-local-ckpt-") as tmp:
        for n in range(samples):
            for fault, local, warm in cases:
                name = f"{fault}-{'local' if local else 'disk'}-{'warm' if warm else 'cold'}-{n}"
                work = pathlib.Path(tmp) / name
                measured[(fault, local, warm)].append(
                    _sample(work, local=local, fault=fault, warm=warm)
                )
    metrics = []
    for (fault, local, warm), rows in measured.items():
        figures = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        detail: dict[str, object] = dict(figures)
        detail.update(
            samples_s=[round(r["back_s"], 3) for r in rows],
            step_s=STEP_S,
            disk_every=DISK_EVERY,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        )
        storage = "local_every_step" if local else f"disk_every_{DISK_EVERY}"
        name = f"{fault}_back_at_fault_step_{storage}{'_warm' if warm else ''}"
        metrics.append(Metric(AREA, name, figures["back_s"], "s", len(rows), None, detail))
    for m in metrics:
        extra = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.detail.items()
        )
        print(f"  {m.name}: {m.value:.3f} {m.unit} ({extra})", flush=True)
    return metrics
