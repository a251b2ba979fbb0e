"""What the ranks report while a cycle runs, turned into journal records.

The monitors' events (:meth:`RankReports.handle`: connections, a rank terminated by its
monitor, the first training step, workload control requests), what the ranks restored
from local checkpoints (:meth:`RankReports.journal_restore`) and the progress marker
(:meth:`RankReports.journal_progress`). The agent calls these from its tick; they read
and fill the current cycle's state (:class:`._cycle_state.CycleState`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

from nvrx.ft._events import (
    RankConnected,
    RankDisconnected,
    RankEvent,
    RankFirstStep,
    RankTerminated,
    WorkloadRequest,
)

from ._cycle_state import CycleState, RankPids
from ._events import (
    CheckpointRestored,
    FirstStep,
    MonitorDied,
    ProgressMoved,
    RankTerminatedByMonitor,
    Recorder,
    WorkloadControl,
    from_monitor_event,
)
from ._local_ckpt import RestoreWatch
from ._progress import read_progress

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: How often the progress file is read, at most.
PROGRESS_CHECK_PERIOD_S = 1.0


class RankReports:
    """Journals what the ranks report; ``cycle`` and ``local_world_size`` are read per call."""

    def __init__(
        self,
        recorder: Recorder,
        cycle: Callable[[], CycleState],
        local_world_size: Callable[[], int],
        *,
        restores: RestoreWatch | None = None,
        progress_file: str | None = None,
    ) -> None:
        self._recorder = recorder
        self._cycle_now = cycle
        self._local_world_size = local_world_size
        self._restores = restores
        self._progress_file = progress_file
        #: This cycle's rank pids and every earlier cycle's.
        self.rank_pids = RankPids()
        self._next_progress_check = 0.0
        self._last_progress: int | None = None

    def handle(self, events: list[RankEvent], noticed: float) -> None:
        """Act on the monitors' events; workload control requests are kept on the cycle."""
        for event in events:
            if self.rank_pids.is_stale(event.pid):
                logger.debug(
                    "dropped %s of an earlier cycle's rank (pid %d)", event.EVENT, event.pid
                )
                continue
            cycle = self._cycle_now()
            match event:
                case RankConnected():
                    cycle.connected.add(event.local_rank)
                    logger.debug("rank %d (local %d) connected", event.rank, event.local_rank)
                case RankDisconnected():
                    cycle.connected.discard(event.local_rank)
                case RankTerminated():
                    cycle.terminated[event.local_rank] = event
                    if cycle.first_report is None:
                        cycle.first_report = noticed
                        cycle.first_report_mono = time.monotonic()
                    self._recorder.record(
                        from_monitor_event(RankTerminatedByMonitor, cycle.number, event)
                    )
                case RankFirstStep():
                    self._note_first_step(event)
                case WorkloadRequest():
                    self._recorder.record(from_monitor_event(WorkloadControl, cycle.number, event))
                    cycle.note_request(event)

    def monitors_died(self, dead: Mapping[int, int | None]) -> list[str]:
        """Journal each dead monitor (local rank -> its exit code); the phrases of those
        whose rank was connected, which went unwatched (they end the cycle)."""
        cycle = self._cycle_now()
        causes = []
        for local_rank, code in sorted(dead.items()):
            served = local_rank in cycle.connected
            self._recorder.record(
                MonitorDied(
                    cycle=cycle.number,
                    local_rank=local_rank,
                    exit_code=code,
                    rank_was_connected=served,
                )
            )
            if served:
                causes.append(f"the monitor of local rank {local_rank} died (exit code {code})")
        return causes

    def _note_first_step(self, event: RankFirstStep) -> None:
        """Journal the cycle's ``first_step`` once every local rank finished its first step."""
        cycle = self._cycle_now()
        cycle.first_steps.setdefault(event.local_rank, event)
        local = self._local_world_size()
        if cycle.first_step_recorded or len(cycle.first_steps) < local:
            return
        cycle.first_step_recorded = True
        self.journal_restore(final=True)  # the restore came before: its record first
        steps = cycle.first_steps.values()
        self._recorder.record(
            FirstStep(
                cycle=cycle.number,
                first_step=max(e.step_wall for e in steps),
                since_init_s=max(e.since_init_s for e in steps),
                local_ranks=sorted(cycle.first_steps),
            )
        )

    def journal_restore(self, *, final: bool = False) -> None:
        """Journal what this node's ranks restored this cycle, once (local checkpoints).

        ``final``: the first step or the cycle's end, when the records there are all
        there will be. Reading them never stops the job.
        """
        if self._restores is None:
            return
        try:
            restore = self._restores.poll(final=final)
        except Exception as exc:  # a record for information never stops the job
            logger.debug("restore records: %r", exc)
            return
        if restore is None:
            return
        self._recorder.record(
            CheckpointRestored(
                cycle=self._cycle_now().number,
                source=restore.source,
                iteration=restore.iteration,
                snapshot_wall=restore.snapshot_wall,
                restore_s=restore.restore_s,
                ranks=restore.ranks,
            )
        )

    def journal_progress(self) -> None:
        """Journal the progress marker when it moved (a file read at most once a second)."""
        path = self._progress_file
        now = time.monotonic()
        if path is None or now < self._next_progress_check:
            return
        self._next_progress_check = now + PROGRESS_CHECK_PERIOD_S
        value = read_progress(path)
        if value is None or value == self._last_progress:
            return
        self._last_progress = value
        try:
            saved: float | None = os.stat(path).st_mtime
        except OSError:
            saved = None
        self._recorder.record(
            ProgressMoved(cycle=self._cycle_now().number, value=value, saved=saved)
        )
