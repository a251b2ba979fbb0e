"""The main job: a 2-rank Lightning run under ft_launcher that survives injected faults.

    python examples/demo/run_demo.py [--out DIR]

It trains a small model on CPU (gloo) with FaultToleranceCallback and
StragglerDetectionCallback. Rank 1 is slow on purpose, is killed in the first attempt
and hangs in the second; ft_launcher restarts the job in place each time and training
resumes from its last checkpoint. At the end it prints what happened: restarts with
their causes and durations, the hung rank (named before the rank waiting on it), the
goodput split (ETTR, time by phase, badput by cause), the straggler report, the final
loss, and where the logs and JSON reports are.

Then a second job (``train_local.py``, plain torch DDP) takes an in-memory snapshot of
every rank's state at every step (``--local-ckpt-every-n-steps=1``); rank 1 crashes
mid-training and the restarted job resumes from the snapshot of the step before: the
summary says where the restored state came from (this node's memory) and how much
work the crash cost (a fraction of a second, where a disk checkpoint every N steps
loses N/2 steps on average). Exit status 0 means both jobs finished after their faults.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
EXPECTED_RESTARTS = 2
#: The most work the crash in the local-snapshot job may cost, in seconds.
LOCAL_LOSS_BUDGET_S = 5.0


def launcher_command(out: pathlib.Path, args: argparse.Namespace) -> list[str]:
    ft_launcher = pathlib.Path(sys.executable).parent / "ft_launcher"
    return [
        str(ft_launcher),
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={EXPECTED_RESTARTS + 1}",
        f"--log-dir={out / 'logs' / 'ranks'}",
        "--tee=3",
        f"--ft-journal={out / 'journal.jsonl'}",
        f"--ft-progress-file={out / 'progress'}",
        "--ft-initial-rank-heartbeat-timeout=90",
        f"--ft-rank-heartbeat-timeout={args.heartbeat_timeout}",
        "--workers-stop-timeout=2",
        # Restarted ranks come from spares that imported torch and Lightning already
        # (and torch._dynamo, which DDP imports when it wraps the model).
        "--warm-spares",
        "--warm-spare-preload=torch,torch._dynamo,lightning",
        str(HERE / "train.py"),
        f"--out={out}",
        f"--max-steps={args.max_steps}",
        "--faults=kill,hang",
    ]


def local_launcher_command(out: pathlib.Path, args: argparse.Namespace) -> list[str]:
    """The second job: a snapshot of every rank's state in memory at every step."""
    ft_launcher = pathlib.Path(sys.executable).parent / "ft_launcher"
    shm = pathlib.Path("/dev/shm")  # the default base; a private 0700 dir is made in it
    base = [] if os.access(shm, os.W_OK) else [f"--local-ckpt-dir={out}"]
    return [
        str(ft_launcher),
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        f"--log-dir={out / 'logs' / 'ranks'}",
        "--tee=3",
        f"--ft-journal={out / 'journal.jsonl'}",
        "--ft-initial-rank-heartbeat-timeout=90",
        f"--ft-rank-heartbeat-timeout={args.heartbeat_timeout}",
        "--workers-stop-timeout=2",
        *base,
        "--local-ckpt-every-n-steps=1",
        # The restarted ranks are spares that imported torch and the local checkpoint
        # module already: the restore is then most of what the restart costs the ranks.
        "--warm-spares",
        str(HERE / "train_local.py"),
        f"--out={out}",
    ]


def run_launcher(command: list[str], log_path: pathlib.Path) -> tuple[int, float]:
    """Run ft_launcher, show its own lines live, keep everything in ``log_path``."""
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[ft_launcher"):
                    print(f"{time.monotonic() - start:6.1f}s  {line.rstrip()}", flush=True)
            rc = proc.wait()
        except BaseException:
            proc.terminate()  # ft_launcher forwards it to every rank and monitor
            proc.wait(timeout=60)
            raise
    return rc, time.monotonic() - start


def read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def describe_restarts(journal: list[dict[str, Any]]) -> list[str]:
    """One line per restart: the launcher's decision (the cause) and how long it took."""
    decisions = [e for e in journal if e["event"] == "decision" and e["action"] == "restart"]
    restarts = [e for e in journal if e["event"] == "restart"]
    warm = {
        e["cycle"]: e.get("warm_local_ranks", [])
        for e in journal
        if e["event"] == "workers_started"
    }
    lines = []
    for number, decision in enumerate(decisions, 1):
        line = f"restart {number}: {decision['reason']}"
        if number <= len(restarts):
            r = restarts[number - 1]
            line += (
                f"\n      back up in {r['total_s']:.2f} s (stop {r['stop_s']:.2f} s, "
                f"rendezvous {r['rendezvous_s']:.2f} s, spawn {r['spawn_s']:.2f} s); "
                f"local ranks started from warm spares: {warm.get(r['cycle'], [])}"
            )
        lines.append(line)
    return lines


def describe_hangs(journal: list[dict[str, Any]]) -> list[str]:
    """One line per hang: the rank that hung first, then the ranks waiting on it."""
    return [
        f"cycle {e['cycle']}: {e['sentence']}" for e in journal if e["event"] == "hang_attributed"
    ]


def describe_goodput(journal: list[dict[str, Any]]) -> list[str]:
    """The job's goodput split (the launcher's job_goodput record), one line per phase."""
    summaries = [e["summary"] for e in journal if e["event"] == "job_goodput"]
    if not summaries:
        return ["goodput: no job_goodput record in the journal"]
    g = summaries[-1]
    total = g["total_s"]
    ettr = "n/a" if g["ettr"] is None else f"{g['ettr']:.1%}"
    lines = [f"goodput: ETTR {ettr} of {total:.1f} s wall time"]
    for phase, seconds in g["seconds"].items():
        if seconds > 0 or phase == "productive":
            share = seconds / total if total > 0 else 0.0
            lines.append(f"  {phase:<15} {seconds:8.2f} s {share:6.1%}")
    for cause, seconds in sorted(g["by_cause"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  badput from {cause}: {seconds:.2f} s")
    if g.get("unknown"):
        lines.append("  not in the records: " + "; ".join(g["unknown"]))
    return lines


def summary(out: pathlib.Path, rc: int, wall: float) -> tuple[str, bool]:
    journal = read_jsonl(out / "journal.jsonl")
    restarts = describe_restarts(journal)
    attempts = read_jsonl(out / "attempts.jsonl")
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    report_path = out / "straggler_report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else None

    lines = ["", "=" * 72, "nvrx demo summary", "=" * 72]
    lines.append(f"ft_launcher exit code {rc} after {wall:.1f} s")
    lines.append(f"restarts: {len(restarts)}")
    lines += [f"  - {r}" for r in restarts]
    hangs = describe_hangs(journal)
    lines.append(
        "hung rank (named first, then the ranks waiting on it):" if hangs else "hangs: none"
    )
    lines += [f"  - {h}" for h in hangs]
    lines += describe_goodput(journal)
    lines.append("attempts (where each resumed):")
    lines += [f"  - attempt {a['attempt']} started at step {a['start_step']}" for a in attempts]
    if report is None:
        lines.append("straggler report: none written")
    else:
        lines.append(f"straggler report (latest): stragglers {report.get('stragglers')}")
        for row in report.get("worst", []):
            lines.append(f"  - {row}")
    if result is None:
        lines.append("training did not finish: no result.json")
    else:
        lines.append(
            f"finished at step {result['global_step']} (attempt {result['attempt']}), "
            f"final loss {result['final_loss']:.4f}"
        )
    lines.append(f"outputs: {out}")
    lines.append(f"  launcher log    {out / 'launcher.log'}")
    lines.append(f"  rank logs       {out / 'logs' / 'ranks'}")
    lines.append(f"  journal (JSON)  {out / 'journal.jsonl'}")
    lines.append(f"  metrics (CSV)   {out / 'logs'}")
    if report is not None:
        lines.append(f"  stragglers      {report_path}")
    # Both faults must have hit mid-training: the run that finished is the third attempt.
    ok = (
        rc == 0
        and result is not None
        and result["attempt"] == EXPECTED_RESTARTS
        and len(restarts) == EXPECTED_RESTARTS
    )
    lines.append("RESULT: " + ("the job survived both faults" if ok else "FAILED"))
    return "\n".join(lines), ok


def describe_restores(journal: list[dict[str, Any]]) -> list[str]:
    """One line per cycle and node: what the ranks restored (``checkpoint_restored``)."""
    words = {
        "own": "this node's memory",
        "peer": "a peer node's replica",
        "global": "the global (disk) checkpoint",
        "none": "nothing: a fresh start",
    }
    lines = []
    for e in journal:
        if e["event"] != "checkpoint_restored":
            continue
        at = "" if e["iteration"] is None else f"iteration {e['iteration']} "
        lines.append(
            f"cycle {e['cycle']}: restored {at}from {words.get(e['source'], e['source'])} "
            f"in {e['restore_s']:.2f} s"
        )
    return lines


def local_summary(out: pathlib.Path, rc: int, wall: float) -> tuple[str, bool]:
    """The local-snapshot job: where the state came from and what the crash cost."""
    journal = read_jsonl(out / "journal.jsonl")
    result_path = out / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    lines = ["", "=" * 72, "local snapshots: a crash with an in-memory snapshot every step"]
    lines.append("=" * 72)
    lines.append(f"ft_launcher exit code {rc} after {wall:.1f} s")
    restores = describe_restores(journal)
    lines.append("restored state:" if restores else "restored state: no checkpoint_restored")
    lines += [f"  - {r}" for r in restores]
    lines += [f"  - attempt {a['attempt']} started at step {a['start_step']} ({a['source']})"
              for a in read_jsonl(out / "attempts.jsonl")]  # fmt: skip
    costs = [r for e in journal if e["event"] == "job_goodput" for r in e["summary"]["restarts"]]
    for cost in costs:
        lost = cost.get("recomputed_s")
        lines.append(
            f"restart {cost['from_cycle']}->{cost['cycle']} ({cost['cause']}): work lost "
            + ("unknown" if lost is None else f"{lost:.2f} s")
            + f", state from {cost.get('restored_from') or 'unknown'}"
            + (
                ""
                if cost.get("restored_iteration") is None
                else f" (iteration {cost['restored_iteration']})"
            )
        )
    lines += describe_goodput(journal)
    if result is None:
        lines.append("training did not finish: no result.json")
    else:
        lines.append(
            f"finished at step {result['global_step']} (attempt {result['attempt']}), "
            f"final loss {result['final_loss']:.4f}"
        )
    lines.append(f"outputs: {out}")
    lost_s = [c.get("recomputed_s") for c in costs]
    ok = (
        rc == 0
        and result is not None
        and result["attempt"] == 1
        and len(costs) == 1
        and costs[0].get("restored_from") == "own"
        and lost_s[0] is not None
        and lost_s[0] <= LOCAL_LOSS_BUDGET_S
    )
    verdict = f"the crash cost {lost_s[0]:.2f} s of work" if ok and lost_s[0] is not None else ""
    lines.append("RESULT: " + (verdict if ok else "FAILED"))
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo-output"))
    parser.add_argument("--max-steps", type=int, default=600)
    parser.add_argument("--heartbeat-timeout", type=float, default=8.0)
    parser.add_argument("--only-local", action="store_true", help="run only the local-snapshot job")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    ok = True
    if not args.only_local:
        command = launcher_command(out, args)
        print("running:", " ".join(command), flush=True)
        rc, wall = run_launcher(command, out / "launcher.log")
        text, ok = summary(out, rc, wall)
        print(text)
    local = out / "local"
    local.mkdir()
    command = local_launcher_command(local, args)
    print("running:", " ".join(command), flush=True)
    rc, wall = run_launcher(command, local / "launcher.log")
    text, local_ok = local_summary(local, rc, wall)
    print(text)
    return 0 if ok and local_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
