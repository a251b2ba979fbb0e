"""How often the hung rank is named: N real 4-rank gloo hangs, a random hung rank each.

Each run is tests-integration-style real processes (packages/nvrx-ft-launcher/tests/
test_culprit_real.run_hang): 4 ranks under their own nvrx.ft monitors, one rank hangs
in user code (time.sleep in a loop) while the others block in all_reduce; the monitors'
rank_terminated events go to find_culprit. Reports right / undecided / wrong counts
(the target: wrong == 0) and the time each run took.

    .venv-dev/bin/python benchmarks/bench_culprit.py [--runs 20] [--seed S] [--json]

Measured on the shared 2-core dev box, ``--runs 20 --seed 18`` (hung ranks 0/1/2/3:
2/8/5/5 times): right 20, undecided 0, wrong 0; 9.6-15.2 s per run.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import random
import sys
import tempfile
import time

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[1] / "packages/nvrx-ft-launcher/tests")
)

from test_culprit_real import WORLD, run_hang  # type: ignore[import-not-found, unused-ignore]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()
    rows = []
    for i in range(args.runs):
        hung = rng.randrange(WORLD)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-culprit-") as tmp:
            run = run_hang(hung, pathlib.Path(tmp))
        took = time.monotonic() - start
        f = run.finding
        outcome = "undecided" if f.culprit is None else ("right" if f.culprit == hung else "wrong")
        counts[outcome] += 1
        rows.append({"hung": hung, "outcome": outcome, "s": round(took, 1), "sentence": f.sentence})
        print(
            f"run {i + 1:2d}: hung rank {hung}: {outcome:9s} ({took:.1f} s) {f.sentence}",
            flush=True,
        )
    summary = {k: counts[k] for k in ("right", "undecided", "wrong")} | {"runs": args.runs}
    print(json.dumps(summary) if args.json else f"summary: {summary}")
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
