"""The sustained-slowdown rule: a rank slower than its peers for several reports in a row.

NVRx's rule (:meth:`~nvrx.straggler.Report.identify_stragglers`) flags a rank whose
score in one report is below a fixed threshold (0.75 by default). That misses a GPU
that throttles slowly (5-20% slower, never below 0.75), and flags a rank whose one
window was noisy. This rule is an addition; NVRx's scores and rule are unchanged.

For each relative score (GPU, and each section), in each report:

* a rank's *slowdown* is how much slower it is than the median rank:
  ``median(scores) / score - 1`` (``score = ref / time``, so this is
  ``time / median time - 1``, independent of the fastest rank);
* a rank is flagged when, over the last ``windows`` reports in a row, its mean
  slowdown is at least ``min_slowdown`` **and** its slowdown was at least half of
  that in every one of them. One bad window cannot do it (it would need the others
  too); a slowdown that holds does, after ``windows`` reports.

It needs at least ``min_ranks`` scored ranks (the median must mean something) and
sees all ranks only where they are gathered (rank 0 with ``gather_on_rank0``). A rank
missing from a report, or with NaN, starts over. The trade-off is measured in
``tests/test_drift.py`` and documented in the straggler guide.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from nvrx.straggler.statistics import Statistic, summarize

if TYPE_CHECKING:
    from nvrx.straggler._report import Report

__all__ = ["SustainedSlowdown", "SustainedSlowdownRule"]

_INF = math.inf


@dataclasses.dataclass(frozen=True, slots=True)
class SustainedSlowdown:
    """A rank the rule flags: ``slowdown`` is its mean over ``windows`` reports.

    ``section`` is None for the GPU relative score, else the section's name.
    """

    rank: int
    section: str | None
    slowdown: float
    windows: int
    reason: str


class SustainedSlowdownRule:
    """Flags ranks slower than the median rank by ``min_slowdown`` for ``windows`` reports.

    Keep one instance per detector; :meth:`update` is fed every report in order.
    """

    def __init__(self, min_slowdown: float = 0.04, windows: int = 3, min_ranks: int = 3) -> None:
        if not 0 < min_slowdown < 10:
            raise ValueError(f"min_slowdown must be in (0, 10), got {min_slowdown!r}")
        if not (isinstance(windows, int) and windows >= 1):
            raise ValueError(f"windows must be an int >= 1, got {windows!r}")
        if not (isinstance(min_ranks, int) and min_ranks >= 2):
            raise ValueError(f"min_ranks must be an int >= 2, got {min_ranks!r}")
        self.min_slowdown = float(min_slowdown)
        self.windows = windows
        self.min_ranks = min_ranks
        # score key (None: GPU) -> rank -> slowdowns of the last reports in a row
        self._runs: dict[str | None, dict[int, tuple[float, ...]]] = {}

    def __repr__(self) -> str:
        return (
            f"SustainedSlowdownRule(min_slowdown={self.min_slowdown}, windows={self.windows}, "
            f"min_ranks={self.min_ranks})"
        )

    def reset(self) -> None:
        """Forget every run (after a deliberate change of workload)."""
        self._runs.clear()

    def update(self, report: Report) -> tuple[SustainedSlowdown, ...]:
        """Take one report's relative scores; return the ranks flagged now."""
        keyed: list[tuple[str | None, Mapping[int, float]]] = [
            (None, report.gpu_relative_perf_scores)
        ]
        keyed.extend(sorted(report.section_relative_perf_scores.items()))
        flagged: list[SustainedSlowdown] = []
        for key, scores in keyed:
            flagged.extend(self._update_one(key, scores))
        for key in list(self._runs):
            if key is not None and key not in report.section_relative_perf_scores:
                del self._runs[key]
        return tuple(flagged)

    def _update_one(self, key: str | None, scores: Mapping[int, float]) -> list[SustainedSlowdown]:
        finite = [s for s in scores.values() if 0 < s < _INF]  # False for NaN
        if len(finite) < self.min_ranks:
            self._runs.pop(key, None)
            return []
        median = summarize(finite)[Statistic.MED]
        minimum = self.min_slowdown
        half = minimum / 2
        limit = median / (1 + half)  # slowdown >= half  <=>  score <= limit
        old = self._runs.get(key, {})
        keep = self.windows - 1
        runs: dict[int, tuple[float, ...]] = {}
        out: list[SustainedSlowdown] = []
        slow = [(r, s) for r, s in scores.items() if 0 < s <= limit]  # NaN is never here
        for rank, score in slow:
            previous = old.get(rank, ())
            run = (
                (*previous[len(previous) - keep :], median / score - 1)
                if keep
                else (median / score - 1,)
            )
            runs[rank] = run
            if len(run) == self.windows:
                mean = sum(run) / self.windows
                if mean >= minimum:
                    out.append(self._flag(rank, key, mean))
        self._runs[key] = runs
        return out

    def _flag(self, rank: int, key: str | None, mean: float) -> SustainedSlowdown:
        what = "GPU" if key is None else f"section {key!r}"
        return SustainedSlowdown(
            rank,
            key,
            mean,
            self.windows,
            f"rank {rank}: {what} {mean:.1%} slower than the median rank on average over "
            f"the last {self.windows} reports (each at least {self.min_slowdown / 2:.1%}; "
            f"threshold {self.min_slowdown:.1%})",
        )
