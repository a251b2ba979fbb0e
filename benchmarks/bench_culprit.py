"""How often the hung rank is named: N real 4-rank gloo hangs, a random hung rank each.

Each run is tests-integration-style real processes (packages/nvrx-ft-launcher/tests/
test_culprit_real.run_hang): 4 ranks under their own nvrx.ft monitors, one rank hangs
in user code (time.sleep in a loop) while the others block in all_reduce; the monitors'
rank_terminated events go to find_culprit. Reports right / undecided / wrong counts
(the target: wrong == 0) and the time each run took.

    .venv-dev/bin/python benchmarks/bench_culprit.py [--runs 20] [--seed S] [--json]

In ``nox -s bench`` (``run``): 20 runs with seed 18 (4 with ``--quick``), reported as
``culprit_wrong`` (target 0), ``culprit_right`` and ``culprit_undecided`` (counts) and
the time a run took.

Measured on the shared 2-core dev box, ``--runs 20 --seed 18`` (hung ranks 0/1/2/3:
2/8/5/5 times): right 20, undecided 0, wrong 0; 9.6-15.2 s per run.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import statistics
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
from test_culprit_real import WORLD, run_hang  # type: ignore[import-not-found, unused-ignore]

AREA = "culprit"


def run(quick: bool) -> list[Metric]:
    """The bench suite's entry: the runs below with a fixed seed, as metrics."""
    runs = 4 if quick else 20
    counts, rows = hang_runs(runs, 18)
    seconds = [float(row["s"]) for row in rows]
    return [
        Metric(AREA, "culprit_wrong", counts["wrong"], "runs", runs, target=0),
        Metric(AREA, "culprit_right", counts["right"], "runs", runs),
        Metric(AREA, "culprit_undecided", counts["undecided"], "runs", runs),
        Metric(AREA, "culprit_run", statistics.median(seconds), "s", runs, detail={"runs": rows}),
    ]


def hang_runs(runs: int, seed: int | None) -> tuple[collections.Counter[str], list[dict[str, Any]]]:
    """``runs`` real hangs of a random rank: the outcome counts and one row per run."""
    rng = random.Random(seed)
    counts: collections.Counter[str] = collections.Counter()
    rows: list[dict[str, Any]] = []
    for i in range(runs):
        hung = rng.randrange(WORLD)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-culprit-") as tmp:
            hang = run_hang(hung, pathlib.Path(tmp))
        took = time.monotonic() - start
        f = hang.finding
        outcome = "undecided" if f.culprit is None else ("right" if f.culprit == hung else "wrong")
        counts[outcome] += 1
        rows.append({"hung": hung, "outcome": outcome, "s": round(took, 1), "sentence": f.sentence})
        print(
            f"run {i + 1:2d}: hung rank {hung}: {outcome:9s} ({took:.1f} s) {f.sentence}",
            flush=True,
        )
    return counts, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    counts, _ = hang_runs(args.runs, args.seed)
    summary = {k: counts[k] for k in ("right", "undecided", "wrong")} | {"runs": args.runs}
    print(json.dumps(summary) if args.json else f"summary: {summary}")
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
