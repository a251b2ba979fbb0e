"""One definition of the summary statistics used for sections and kernels alike.

Every window of timings (a section's host times, a kernel key's GPU durations) is
summarised by :func:`summarize` with the same rules, so numbers from different
sources can be compared. They are the standard library's :mod:`statistics`
definitions (the interval tracker uses the same module):

* ``MIN`` / ``MAX``: smallest and largest retained sample.
* ``MED``: :func:`statistics.median`: for an even number of samples the mean of the
  two middle ones (NVRx takes the lower one, ``torch.median``).
* ``AVG``: :func:`statistics.fmean`, in float64.
* ``STD``: the population standard deviation (:func:`statistics.pstdev`, divides by
  ``n``), 0.0 for one sample. Computed as the square root of the ``fmean`` of squared
  deviations: ``pstdev`` itself works in exact fractions, about 50 times slower, and
  agrees to within rounding.
* ``NUM``: how many measurements the window saw, including any that were evicted
  from the bounded sample buffer (the other statistics use the retained samples).

Where the C extension is built, ``_hotpath.summarize`` computes the same values in one
pass plus a selection instead of a sort (compensated sums, within a few ulps); the
parity tests compare the two. :func:`summarize_python` is the definition.

Units: section times are milliseconds (:data:`SECTION_TIME_UNIT`), kernel durations are
microseconds (:data:`KERNEL_TIME_UNIT`), as in the reference system.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Collection, Mapping

from nvrx.straggler import _native

__all__ = [
    "KERNEL_TIME_UNIT",
    "SECTION_TIME_UNIT",
    "Statistic",
    "Summary",
    "summarize",
    "summarize_python",
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

    # Members are singletons compared by identity: hashing by identity is the same
    # mapping, done in C instead of Enum's Python __hash__ (summaries are looked up a lot).
    __hash__ = object.__hash__

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"Statistic.{self.name}"


Summary = Mapping[Statistic, float]
"""A summary: statistic -> value (``NUM`` holds an integral count)."""

_MIN, _MAX, _MED, _AVG, _STD, _NUM = Statistic


def summarize_python(
    samples: Collection[float], count: int | None = None
) -> dict[Statistic, float]:
    """Summarise one window of samples by the module's definition, in Python.

    ``count`` is the number of measurements seen in the window when the sample
    buffer was bounded and dropped some; it defaults to the number of samples.
    Raises ValueError for an empty window, since nothing can be summarised.
    """
    values = [float(v) for v in samples]
    n = len(values)
    if n == 0:
        raise ValueError("summarize: samples is empty; a window needs at least one sample")
    if count is not None and count < n:
        raise ValueError(f"summarize: count={count} is below the number of samples ({n})")
    avg = statistics.fmean(values)
    return {
        _MIN: min(values),
        _MAX: max(values),
        _MED: float(statistics.median(values)),
        _AVG: avg,
        _STD: math.sqrt(statistics.fmean([(v - avg) * (v - avg) for v in values])),
        _NUM: float(n if count is None else count),
    }


def summarize(samples: Collection[float], count: int | None = None) -> dict[Statistic, float]:
    """:func:`summarize_python`, computed by the C extension where it is built."""
    native = _native.hotpath
    if native is None:
        return summarize_python(samples, count)
    lo, hi, med, avg, std, num = native.summarize(samples, count)
    return {_MIN: lo, _MAX: hi, _MED: med, _AVG: avg, _STD: std, _NUM: num}
