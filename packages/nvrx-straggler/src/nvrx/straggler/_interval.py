"""When to report: an iteration interval every rank agrees on, kept in line with step time.

Reports are collective, so every rank must decide to report at the same iteration.
The tracker counts calls (one per training step), measures the time between calls,
and turns ``time_interval`` seconds into an iteration interval:

* after :data:`ReportIntervalTracker.INTERVAL_ESTIMATION_ITERS` steps, from the median
  step time, agreed across ranks as the maximum proposal (one all-reduce);
* then again at every report, from the median step time since the previous report,
  agreed inside the report's own all-reduce, so a change of step time (warm-up,
  compilation, a new phase) moves the interval within one report.

The interval is never below ``profiling_interval`` (reports in between would be
empty) and is rounded up, never truncated to zero.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable

__all__ = ["MAX_ITER_INTERVAL", "ReportIntervalTracker"]

MAX_ITER_INTERVAL = 10**9
"""Upper bound of an iteration interval (guards against a zero step time)."""


@dataclasses.dataclass
class ReportIntervalTracker:
    """Decides on which iterations ``generate_report_if_interval_elapsed`` reports.

    ``agree`` takes this rank's proposal (iterations) and returns the value all ranks
    agree on; it defaults to the local value (one process). ``clock`` gives seconds.
    """

    INTERVAL_ESTIMATION_ITERS = 16

    time_interval: float = 60.0
    profiling_interval: int = 1
    agree: Callable[[float], float] | None = None
    clock: Callable[[], float] = time.monotonic
    current_iter: int = 0
    iter_interval: int | None = None
    next_report_iter: int | None = None
    prev_iter_start_time: float | None = None
    step_times: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    _elapsed: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.time_interval, (int, float)) and self.time_interval >= 0):
            raise ValueError(
                f"report_time_interval must be >= 0 seconds, got {self.time_interval!r}"
            )
        if not (isinstance(self.profiling_interval, int) and self.profiling_interval >= 1):
            raise ValueError(
                f"profiling_interval must be an int >= 1, got {self.profiling_interval!r}"
            )

    def iter_increase(self) -> None:
        """Count one iteration; agree on the first interval once enough steps were seen."""
        now = self.clock()
        self.current_iter += 1
        if self.prev_iter_start_time is not None:
            self.step_times.append(now - self.prev_iter_start_time)
        self.prev_iter_start_time = now
        if self.iter_interval is None and len(self.step_times) >= self.INTERVAL_ESTIMATION_ITERS:
            proposal = self.propose_interval()
            agreed = self.agree(proposal) if self.agree is not None else proposal
            self.apply_agreed_interval(agreed)
        self._elapsed = self.next_report_iter is not None and (
            self.current_iter >= self.next_report_iter
        )

    def is_interval_elapsed(self) -> bool:
        """True if the last :meth:`iter_increase` landed on a report iteration."""
        return self._elapsed

    def propose_interval(self) -> float:
        """This rank's interval in iterations from the median recent step time."""
        if not self.step_times:
            return float(self.profiling_interval)
        median = statistics.median(self.step_times)
        if median <= 0:
            return float(MAX_ITER_INTERVAL)
        return self.time_interval / median

    def apply_agreed_interval(self, agreed: float) -> None:
        """Use the agreed interval from now on and forget the old step times."""
        if math.isnan(agreed):
            agreed = float(self.profiling_interval)
        interval = math.ceil(min(max(agreed, 1.0), float(MAX_ITER_INTERVAL)))
        self.iter_interval = max(interval, self.profiling_interval)
        self.next_report_iter = self.current_iter + self.iter_interval
        self.step_times.clear()
