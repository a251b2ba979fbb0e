"""The bookkeeping at each start of this node's ranks, around torch's own start.

Before torch starts the ranks (:meth:`CycleStart.before`): the monitors ready (a dead
one replaced) and healthy in the metrics, the cluster steps of a start (the GPU memory
wait on a restart, the NUMA record), a straggler report the last cycle's rank 0 wrote
just before it ended, the new cycle's state (:class:`._cycle_state.CycleState`, with the
progress marker), the straggler reports' and the local-checkpoint restores' new cycle,
and the ``cycle_start`` record. After (:meth:`CycleStart.after`): the new ranks' pids (so
an earlier cycle's late events are dropped), which ranks came from warm spares, and the
``workers_started`` record. The agent keeps torch's start itself, between the two.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from torch.distributed.elastic.agent.server.api import WorkerGroup

from ._cluster_steps import ClusterSteps
from ._cycle_state import CycleState
from ._events import Recorder, WorkersStarted
from ._local_ckpt import RestoreWatch
from ._monitors import MonitorSupervisor
from ._progress import read_progress
from ._rank_reports import RankReports
from ._spares import SpareHandler
from ._straggler_reports import StragglerReports
from .metrics import NullRecorder

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


class CycleStart:
    """Each start of this node's ranks, before and after torch starts them."""

    def __init__(
        self,
        *,
        monitors: MonitorSupervisor,
        metrics: NullRecorder,
        steps: ClusterSteps,
        straggler: StragglerReports,
        reports: RankReports,
        recorder: Recorder,
        restores: RestoreWatch | None = None,
        progress_file: str | None = None,
    ) -> None:
        self._monitors = monitors
        self._metrics = metrics
        self._steps = steps
        self._straggler = straggler
        self._reports = reports
        self._recorder = recorder
        self._restores = restores
        self._progress_file = progress_file
        #: Whether the ranks were started before (every later start is a restart).
        self._started = False

    def before(self, job_cycle: int, wg: WorkerGroup) -> CycleState:
        """Everything due before torch starts cycle ``job_cycle``'s ranks; its new state."""
        self._monitors.renew_dead()
        self._monitors.wait_ready()
        logger.debug("monitors ready")
        for local_rank in range(wg.spec.local_world_size):
            self._metrics.monitor_health(local_rank, True)
        self._steps.before_start(job_cycle, restart=self._started)
        if self._started:  # a report the last cycle's rank 0 wrote just before it ended
            self._straggler.record_new(now=True)
        cycle = CycleState(
            number=job_cycle,
            started=time.time(),  # wall clock: label
            progress=read_progress(self._progress_file),
        )
        # The new cycle's rank 0 (maybe on another node, in a smaller world) reports anew:
        # no gauge keeps a score of the last cycle's ranks.
        self._straggler.start_cycle(cycle.number, cycle.started)
        world = wg.workers[0].world_size if wg.workers else 0
        self._steps.cycle_started(cycle.number, job_cycle, wg.group_rank, world, _ranks(wg))
        self._started = True
        if self._restores is not None:
            self._restores.start_cycle(cycle.number, wg.spec.local_world_size)
        return cycle

    def after(
        self,
        cycle: CycleState,
        wg: WorkerGroup,
        worker_ids: Mapping[int, Any],
        handlers: Iterable[SpareHandler],
    ) -> None:
        """Torch started the ranks (``worker_ids``: local rank -> pid; ``handlers``: the
        warm spares' handlers it used): note their pids and record the start."""
        self._reports.rank_pids.new_cycle(worker_ids.values())
        warm = sorted(h.local_rank_id for h in handlers if h.warm)
        if warm:
            logger.info("local ranks %s started from warm spares", warm)
        self._recorder.record(
            WorkersStarted(
                cycle=cycle.number,
                restart_count=cycle.number,
                group_rank=wg.group_rank,
                group_world_size=wg.group_world_size,
                ranks=_ranks(wg),
                pids=dict(worker_ids),
                warm_local_ranks=warm,
            )
        )


def _ranks(wg: WorkerGroup) -> dict[int, int]:
    """This node's ranks: local rank -> global rank."""
    return {w.local_rank: w.global_rank for w in wg.workers}
