"""Read one big straggler report in a child process and print what the launcher needs.

``python -m nvrx.launcher._straggler_summary PATH`` reads and validates PATH
(:func:`nvrx.ft.read_straggler_scores`) and prints one JSON object: the report's header,
its rank count, wait fraction, worst rank, the lowest scores of each kind (at most
``MAX_SCORE_GAUGES``) and each kind's rank count and median, or ``{"error": ...}``.
Parsing the largest report the format allows takes seconds and hundreds of MiB; here
that is the child's, not the launcher's: the launcher's loop, memory and GIL stay free
for failure handling.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
import sys
from collections.abc import Iterable
from typing import Any

from nvrx.ft import StragglerScores, read_straggler_scores

__all__: list[str] = []

#: Score gauges per kind: the lowest scores (the stragglers) of the latest report.
MAX_SCORE_GAUGES = 256
KINDS = ("relative", "individual")


def _lowest_first(item: tuple[int, float]) -> tuple[bool, float, int]:
    return math.isnan(item[1]), item[1], item[0]  # NaN (nothing comparable) last


def lowest(scores: dict[int, float], count: int = MAX_SCORE_GAUGES) -> dict[int, float]:
    """The ``count`` lowest scores of ``scores`` (all of them when there are no more)."""
    if len(scores) <= count:
        return scores
    return dict(heapq.nsmallest(count, scores.items(), key=_lowest_first))


def median_score(scores: Iterable[float]) -> float | None:
    """The median of the finite ``scores`` (None: there are none)."""
    finite = [v for v in scores if math.isfinite(v)]
    return statistics.median(finite) if finite else None


def stats(scores: dict[int, float]) -> tuple[int, float | None]:
    """How many ranks ``scores`` holds and their median: the gauges' summary."""
    return len(scores), median_score(scores.values())


def summary(scores: StragglerScores) -> dict[str, Any]:
    """The JSON the child prints for ``scores``."""
    worst = scores.worst("relative")
    return {
        "written_at": scores.written_at,
        "window_start": scores.window_start,
        "window_end": scores.window_end,
        "forward_section": scores.forward_section,
        "step_section": scores.step_section,
        "ranks": len(scores.ranks),
        "fraction": scores.wait_fraction(),
        "worst": None if worst is None else list(worst),
        "gauges": {kind: sorted(lowest(scores.scores(kind)).items()) for kind in KINDS},
        "stats": {kind: list(stats(scores.scores(kind))) for kind in KINDS},
    }


def main(argv: list[str]) -> int:
    try:
        out = summary(read_straggler_scores(argv[0]))
    except OSError as exc:
        out = {"error": {"kind": type(exc).__name__, "why": exc.strerror or str(exc)}}
    except ValueError as exc:
        out = {"error": {"kind": "ValueError", "why": str(exc)}}
    except Exception as exc:  # whatever the file holds, the launcher gets a reason
        out = {"error": {"kind": "Exception", "why": f"{type(exc).__name__}: {exc}"}}
    sys.stdout.write(json.dumps(out, allow_nan=True))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
