"""What every benchmark module shares: a result record and robust timing helpers.

A benchmark module is ``benchmarks/bench_<area>.py`` with a function
``run(quick: bool) -> list[Metric]``. ``benchmarks/run.py`` finds and runs them.
Figures are medians over many samples; ratios say how we compare to a baseline.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

__all__ = ["Metric", "median_ns_per_call"]


@dataclasses.dataclass(frozen=True)
class Metric:
    """One measured figure.

    ``value`` is a median in ``unit``; ``target`` (same unit) is the budget the
    issue sets, if any; ``detail`` holds breakdowns and extra figures for the JSON.
    """

    area: str
    name: str
    value: float
    unit: str
    samples: int
    target: float | None = None
    detail: dict[str, object] = dataclasses.field(default_factory=dict)

    @property
    def within_target(self) -> bool | None:
        return None if self.target is None else self.value <= self.target


def median_ns_per_call(
    fn: Callable[[], object], *, calls_per_sample: int = 10_000, samples: int = 31
) -> float:
    """Median over ``samples`` of the mean cost of one ``fn()`` call, in nanoseconds.

    The cost of the empty loop is subtracted so the figure is the call alone.
    """

    def loop(body: Callable[[], object]) -> float:
        start = time.perf_counter_ns()
        for _ in range(calls_per_sample):
            body()
        return (time.perf_counter_ns() - start) / calls_per_sample

    def empty() -> None:
        return None

    costs = []
    for _ in range(samples):
        costs.append(loop(fn) - loop(empty))
    return statistics.median(costs)
