"""Rank 0's straggler reports, journalled by its node's launcher.

:class:`._straggler_feed.StragglerFeed` reads the report file the ranks' rank 0 writes
(through ``NVRX_STRAGGLER_SCORES_FILE``); :class:`StragglerReports` journals each new
report (``straggler_report``: its wait fraction and window, from which the goodput
ledger takes the straggler wait) and each one it cannot use
(``straggler_report_ignored``), and shows the scores in the metrics.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

from ._events import Recorder, StragglerReported, StragglerReportIgnored
from ._straggler_feed import StragglerFeed
from .metrics import NullRecorder

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


class StragglerReports:
    """The feed of one launcher's report file and the journal records it gives."""

    def __init__(
        self,
        path: pathlib.Path,
        recorder: Recorder,
        cycle: Callable[[], int],
        *,
        metrics: NullRecorder,
        on_recorded: Callable[[], None],
    ) -> None:
        self._recorder = recorder
        self._cycle = cycle
        self._on_recorded = on_recorded
        self._straggler = StragglerFeed(path, on_ignored=self._journal_bad_scores, metrics=metrics)

    @property
    def path(self) -> str:
        """Where rank 0 writes its reports."""
        return self._straggler.path

    def start_cycle(self, cycle: int, started: float) -> None:
        self._straggler.start_cycle(cycle, started)

    def close(self) -> None:
        self._straggler.close()

    def record_new(self, *, now: bool = False) -> None:
        """Rank 0's new straggler report: the score gauges, a journal record, the goodput.

        The record (``straggler_report``) carries the report's wait fraction and window,
        from which the ledger (and the job summary's merge) takes the straggler wait.
        ``now``: look at once (the last look before a new cycle starts).
        """
        scores = self._straggler.poll_now() if now else self._straggler.poll()
        if scores is None:
            return
        cycle = self._straggler.cycle_of(scores)  # when it was written, not when read
        try:
            self._straggler.show(scores)
            wait = self._straggler.wait(scores)
            worst = self._straggler.worst(scores)
            self._recorder.record(
                StragglerReported(
                    cycle=self._cycle() if cycle is None else cycle,
                    written_at=scores.written_at,
                    window_start=None if wait is None else wait.start,
                    window_end=None if wait is None else wait.end,
                    wait_fraction=None if wait is None else wait.fraction,
                    forward_section=scores.forward_section,
                    step_section=scores.step_section,
                    ranks=self._straggler.rank_count(scores),
                    worst_rank=None if worst is None else worst[0],
                    worst_score=None if worst is None else worst[1],
                )
            )
            self._on_recorded()
        except Exception as exc:  # a report for information never stops the job
            logger.warning("straggler report not recorded: %r", exc)

    def _journal_bad_scores(self, why: str) -> None:
        """A report that cannot be used: journalled (``straggler_report_ignored``)."""
        self._recorder.record(
            StragglerReportIgnored(cycle=self._cycle(), path=self._straggler.path, why=why)
        )
