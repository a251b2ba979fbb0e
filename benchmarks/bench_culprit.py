"""How often the hung rank and the collective its peers wait in are named, on real hangs.

Each run is tests-integration-style real processes (packages/nvrx-ft-launcher/tests/
test_culprit_real.run_hang): 4 gloo ranks under their own nvrx.ft monitors, one rank
(random) hangs at step 15 while the others block in their 16th all_reduce. Five kinds
of hang, taken in turn:

- ``sleep``: the rank is stuck in Python (time.sleep in a loop) before its all_reduce;
- ``stop``: the rank is stopped (SIGSTOP);
- ``desync``: the rank broadcasts on another process group while the others all-reduce;
- ``read``: the rank blocks in a read of a pipe nobody writes (a long interruptible
  read, state ``S``: its stack dump runs);
- ``dread``: the rank blocks in the kernel in uninterruptible sleep (state ``D``), as on
  a dead NFS server: ``read(2)`` of a file on a FUSE mount whose server answers
  everything but READ (packages/nvrx-ft-launcher/tests/_dstate.py, no libfuse; the read
  waits for the page in ``folio_wait_bit_common``, killable). Its stack dump cannot
  run; its flight recorder (served from C++ threads) still answers, and the termination
  signal, fatal without a handler, ends the wait. Needs root and /dev/fuse: without
  them the default kinds leave it out and say why.

The monitors' rank_terminated events (with each rank's stack summary, /proc state and
flight-recorder position) go to find_culprit. A run is right when the culprit is the
hung rank and the finding's collective is ``all_reduce #16 on default_pg``; a victim
named as culprit or another collective is wrong. ``decided_s`` is the time from the
first monitor's hang event to the last rank's (find_culprit itself takes microseconds):
the launcher decides then.

``culprit_line`` is the same moment seen from a real ``ft_launcher`` (2 gloo ranks of
packages/nvrx-ft-launcher/tests/train_script.py, rank 1 hung in Python, both ignoring
SIGTERM as frameworks that save on SIGTERM outlive it, the default 5 s termination grace
period): the time from the first monitor's detection (its report's last activity plus
the age it measured) to the journal's ``hang_attributed`` (the ``hang in cycle`` line),
target 5 s. Its detail has the time to the ranks' exit (the grace period's SIGKILL),
which is when the launcher named the culprit before it attributed without the exits.
Measured on the shared 2-core dev box (``bench_culprit.py --runs 0 --line``): 0.31 s (the
0.3 s stack dump pause, then the same tick), the exit at 5.33 s; 5.34 s before, at the
exit.

    .venv-dev/bin/python benchmarks/bench_culprit.py [--runs N] [--seed S] [--json] [--line]
        [--kinds sleep,stop,desync,read,dread]

In ``nox -s bench`` (``run``): 10 runs (2 of each kind; 8 without ``dread``) with seed
18 (one of each with ``--quick``), reported as ``culprit_wrong`` and
``collective_wrong`` (targets 0), ``culprit_right`` and ``culprit_undecided`` (counts),
``culprit_decided`` (the slowest run's decided_s, target 5 s), the time a run took and
``culprit_line`` (one launcher run, about 25 s).

Measured on the shared 2-core dev box (load about 9, as root so ``dread`` ran),
``--runs 10 --seed 18`` (two runs of each kind): right 10, undecided 0, wrong 0,
collective wrong 0; decided 0.01-0.06 s after the first hang event; 18.1-24.2 s per run
(3 min 27 s in all). Both ``dread`` runs: the rank in state D with no stack, named by the
flight recorders and the blocked rule: "rank 1: blocked in the kernel (state D), last
heartbeat 4.0 s ago, no stack; ranks 0, 2, 3: blocked in all_reduce; ranks 0, 2, 3 wait
in all_reduce #16 on default_pg while rank 1 is blocked in the kernel". Earlier, without
``dread``: ``--runs 8 --seed 18`` right 8, decided within 0.10 s; ``--runs 12 --seed 7``
right 12, decided within 0.03 s.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# Last on the path: run.py loads every benchmark in one process, and nothing in the
# launcher's tests may shadow a module another benchmark imports.
sys.path.append(
    str(pathlib.Path(__file__).resolve().parents[1] / "packages/nvrx-ft-launcher/tests")
)

from _common import Metric
from _dstate import unavailable_reason  # type: ignore[import-not-found, unused-ignore]
from _launcher_runs import read_jsonl, reap, start_launcher
from test_culprit_real import (  # type: ignore[import-not-found, unused-ignore]
    HUNG_AT_STEP,
    WORLD,
    run_hang,
)

from nvrx.launcher._events import HangAttributed, RankFailed, RankTerminatedByMonitor

AREA = "culprit"
KINDS = ("sleep", "stop", "desync", "read", "dread")
#: What every run's finding must name: the all_reduce of the step after the hang.
WAITED = {"op": "all_reduce", "group": "default_pg", "seq": HUNG_AT_STEP + 1}
DECIDED_TARGET_S = 5.0
_TRAIN = pathlib.Path(__file__).resolve().parents[1] / (
    "packages/nvrx-ft-launcher/tests/train_script.py"
)


def default_kinds() -> tuple[str, ...]:
    """Every kind this machine can make (``dread`` needs root and /dev/fuse)."""
    if unavailable_reason() is None:
        return KINDS
    print(f"bench_culprit: no dread runs: {unavailable_reason()}", flush=True)
    return tuple(k for k in KINDS if k != "dread")


def run(quick: bool) -> list[Metric]:
    """The bench suite's entry: the runs below with a fixed seed, as metrics."""
    kinds = default_kinds()
    runs = len(kinds) * (1 if quick else 2)
    counts, rows = hang_runs(runs, 18, kinds)
    seconds = [float(row["s"]) for row in rows]
    decided = max(float(row["decided_s"]) for row in rows)
    return [
        Metric(AREA, "culprit_wrong", counts["wrong"], "runs", runs, target=0),
        Metric(AREA, "collective_wrong", counts["collective_wrong"], "runs", runs, target=0),
        Metric(AREA, "culprit_right", counts["right"], "runs", runs),
        Metric(AREA, "culprit_undecided", counts["undecided"], "runs", runs),
        Metric(AREA, "culprit_decided", decided, "s", runs, target=DECIDED_TARGET_S),
        Metric(
            AREA,
            "culprit_run",
            statistics.median(seconds),
            "s",
            runs,
            detail={"runs": rows, "kinds": list(kinds), "no_dread": unavailable_reason()},
        ),
        launcher_line(),
    ]


def launcher_line() -> Metric:
    """``culprit_line``: one real launcher, its ranks outliving SIGTERM (see the top)."""
    with tempfile.TemporaryDirectory(prefix="bench-culprit-line-") as tmp:
        work = pathlib.Path(tmp)
        (work / "out").mkdir()
        journal = work / "journal.jsonl"
        argv = [
            sys.executable, "-m", "nvrx.launcher", "--standalone", "--nproc-per-node", "2",
            "--max-restarts", "0", "--monitor-interval", "0.1",
            "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "4",
            "--ft-journal", str(journal), "--redirects", "3", "--log-dir", str(work / "logs"),
            str(_TRAIN), "--out", str(work / "out"), "--steps", "8", "--fault", "sleep:1:4",
            "--ignore-sigterm",
        ]  # fmt: skip
        launched = start_launcher(argv, work / "launcher.log")
        try:
            launched.proc.wait(180)
        except subprocess.TimeoutExpired:
            pass
        finally:
            reap([launched])
        records = read_jsonl(journal)
    reports = [r for r in records if r["event"] == RankTerminatedByMonitor.EVENT]
    found = [r for r in records if r["event"] == HangAttributed.EVENT]
    failed = [r for r in records if r["event"] == RankFailed.EVENT]
    if not reports or not found or not failed:
        raise RuntimeError(f"culprit_line: no hang attributed in {len(records)} records")
    detected = min(r["last_activity_wall"] + r["last_activity_s"] for r in reports)
    line_s = found[0]["t"] - detected
    return Metric(
        AREA,
        "culprit_line",
        round(line_s, 3),
        "s",
        1,
        target=DECIDED_TARGET_S,
        detail={
            "exit_s": round(failed[0]["t"] - detected, 3),
            "grace_period_s": 5.0,
            "culprit": found[0]["culprit"],
            "sentence": found[0]["sentence"],
        },
    )


def hang_runs(
    runs: int, seed: int | None, kinds: tuple[str, ...]
) -> tuple[collections.Counter[str], list[dict[str, Any]]]:
    """``runs`` real hangs of a random rank, kinds in turn: outcome counts and rows."""
    rng = random.Random(seed)
    counts: collections.Counter[str] = collections.Counter()
    rows: list[dict[str, Any]] = []
    for i in range(runs):
        kind = kinds[i % len(kinds)]
        hung = rng.randrange(WORLD)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-culprit-") as tmp:
            hang = run_hang(hung, pathlib.Path(tmp), kind)
        took = time.monotonic() - start
        f = hang.finding
        outcome = "undecided" if f.culprit is None else ("right" if f.culprit == hung else "wrong")
        counts[outcome] += 1
        collective_ok = f.collective == WAITED
        if not collective_ok:
            counts["collective_wrong"] += 1
        rows.append(
            {
                "kind": kind,
                "hung": hung,
                "outcome": outcome,
                "collective_ok": collective_ok,
                "decided_s": round(hang.decided_s, 2),
                "s": round(took, 1),
                "sentence": f.sentence,
            }
        )
        print(
            f"run {i + 1:2d}: {kind:6s} rank {hung}: {outcome:9s} collective "
            f"{'ok' if collective_ok else 'WRONG'}, decided in {hang.decided_s:.2f} s "
            f"({took:.1f} s) {f.sentence}",
            flush=True,
        )
    return counts, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="default: 2 of each kind")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--kinds", default=None, help="comma-separated hang kinds (default: all this machine can)"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--line", action="store_true", help="also measure culprit_line (one real launcher)"
    )
    args = parser.parse_args()
    kinds = default_kinds() if args.kinds is None else tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds {args.kinds!r}: expected some of {', '.join(KINDS)}")
    if "dread" in kinds and unavailable_reason() is not None:
        parser.error(f"--kinds dread: {unavailable_reason()}")
    runs = 2 * len(kinds) if args.runs is None else args.runs
    counts, rows = hang_runs(runs, args.seed, kinds)
    keys = ("right", "undecided", "wrong", "collective_wrong")
    summary: dict[str, Any] = {k: counts[k] for k in keys} | {"runs": runs}
    summary["decided_s_max"] = max(float(r["decided_s"]) for r in rows) if rows else None
    if args.line:
        line = launcher_line()
        summary["culprit_line_s"] = line.value
        summary["culprit_line_exit_s"] = line.detail["exit_s"]
    print(json.dumps(summary) if args.json else f"summary: {summary}")
    return 1 if counts["wrong"] or counts["collective_wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
