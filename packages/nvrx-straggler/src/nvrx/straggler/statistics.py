"""One definition of the summary statistics used for sections and kernels alike.

Every window of timings (a section's host times, a kernel key's GPU durations) is
summarised by :func:`summarize` with the same rules, so numbers from different
sources can be compared:

* ``MIN`` / ``MAX``: smallest and largest retained sample.
* ``MED``: the median; for an even number of samples the mean of the two middle ones.
* ``AVG``: arithmetic mean, computed in float64 with ``math.fsum``.
* ``STD``: population standard deviation (divides by ``n``), 0.0 for one sample.
* ``NUM``: how many measurements the window saw, including any that were evicted
  from the bounded sample buffer (the other statistics use the retained samples).

Units: section times are milliseconds (:data:`SECTION_TIME_UNIT`), kernel durations are
microseconds (:data:`KERNEL_TIME_UNIT`), as in the reference system.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping

__all__ = [
    "KERNEL_TIME_UNIT",
    "SECTION_TIME_UNIT",
    "Statistic",
    "Summary",
    "summarize",
]

SECTION_TIME_UNIT = "ms"
"""Unit of every section statistic (host wall time, or GPU time with CUDA events)."""

KERNEL_TIME_UNIT = "us"
"""Unit of every kernel statistic (CUPTI start-to-end duration)."""


class Statistic(enum.Enum):
    """Keys of a summary: the statistics computed for each section and kernel."""

    MIN = enum.auto()
    MAX = enum.auto()
    MED = enum.auto()
    AVG = enum.auto()
    STD = enum.auto()
    NUM = enum.auto()

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Statistic.{self.name}"


Summary = Mapping[Statistic, float]
"""A summary: statistic -> value (``NUM`` holds an integral count)."""


def summarize(samples: Iterable[float], count: int | None = None) -> dict[Statistic, float]:
    """Summarise one window of samples by the module's single definition.

    ``count`` is the number of measurements seen in the window when the sample
    buffer was bounded and dropped some; it defaults to the number of samples.
    Raises ValueError for an empty window, since nothing can be summarised.
    """
    values = sorted(map(float, samples))
    n = len(values)
    if n == 0:
        raise ValueError("summarize: samples is empty; a window needs at least one sample")
    if count is not None and count < n:
        raise ValueError(f"summarize: count={count} is below the number of samples ({n})")
    mid = n // 2
    median = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0
    avg = math.fsum(values) / n
    var = math.fsum([(v - avg) * (v - avg) for v in values]) / n
    return {
        Statistic.MIN: values[0],
        Statistic.MAX: values[-1],
        Statistic.MED: median,
        Statistic.AVG: avg,
        Statistic.STD: math.sqrt(var),
        Statistic.NUM: float(n if count is None else count),
    }
