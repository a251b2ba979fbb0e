"""Applying the decision that ends a cycle on this node: stop, then leave, end or restart.

Every node follows the cycle's one decision (:mod:`._coordination`) the same way:
journal it (``decision``), stop its ranks (``workers_stopped``), then

- ``exclude`` (the decision excludes this node, or it asked to leave): leave torch's
  rendezvous at once, exit 3;
- ``stop`` / ``shutdown``: end the job here (goodput summary, rendezvous closed),
  exit with the decision's code;
- ``restart``: take the decision's job state, join the next rendezvous and start the
  ranks (``restart``, with each phase's duration; ``restart_failed`` when the rendezvous
  raises).

What touches torch (stopping, the rendezvous, spawning) is the agent's, given here as
:class:`TorchSteps`; this module owns the order, the records and the timings.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from ._coordination import Decision, JobState
from ._cycle_decisions import decision_taken, restart_line
from ._cycle_state import CycleState
from ._events import Recorder, Restarted, RestartFailed, WorkersStopped
from ._launcher_exit import LauncherExit

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")


@dataclasses.dataclass(frozen=True)
class TorchSteps:
    """What a decision asks of the agent's torch glue."""

    #: Stop this node's ranks (torch's ``_stop_workers``; the group is then STOPPED).
    stop_workers: Callable[[], None]
    #: Take this node out of the rendezvous now (it leaves the job).
    leave_rendezvous: Callable[[], None]
    #: The job ends here for every node: goodput summary, rendezvous closed.
    end_job: Callable[[], None]
    #: Adopt the decision's job state and join the next round (torch's ``_rendezvous``).
    rendezvous: Callable[[JobState], None]
    #: Start the next cycle's ranks (torch's ``_start_workers``; the group is HEALTHY).
    start_workers: Callable[[], None]


def apply_decision(
    decision: Decision,
    cycle: CycleState,
    torch: TorchSteps,
    *,
    noticed: float,
    node: str,
    recorder: Recorder,
    max_restarts: int,
    exclusion_requested: bool = False,
) -> None:
    """Apply ``decision`` to ``cycle`` on this node; returns only after a restart.

    ``noticed``: when this node saw the cycle end (wall clock, a label); the durations are
    measured from ``cycle.noticed_mono``. Leaving or ending the job raises
    :class:`LauncherExit` with this node's exit code.
    """
    taken, exit_code = decision_taken(
        decision, node, cycle=cycle.number, noticed=noticed, exclusion_requested=exclusion_requested
    )
    recorder.record(taken)
    t0_mono, noticed_mono = time.monotonic(), cycle.noticed_mono
    torch.stop_workers()
    stopped, stopped_mono = time.time(), time.monotonic()  # wall clock: label
    recorder.record(WorkersStopped(cycle=cycle.number, workers_stopped=stopped))
    if taken.action != "restart":
        if taken.action == "exclude":
            torch.leave_rendezvous()
        else:
            torch.end_job()
        raise LauncherExit(exit_code, decision.reason)

    logger.warning("%s", restart_line(decision, cycle.number, node, max_restarts))
    first_mono = cycle.first_report_mono
    detect = None if first_mono is None else cycle.noticed_mono - first_mono
    try:
        torch.rendezvous(decision.state)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        recorder.record(RestartFailed(cycle=cycle.number, error=error))
        raise
    rendezvous_done, rendezvous_mono = time.time(), time.monotonic()  # wall clock: label
    torch.start_workers()
    started, started_mono = time.time(), time.monotonic()  # wall clock: label
    recorder.record(
        Restarted(
            from_cycle=cycle.number,
            cycle=decision.state.cycle,
            charged=decision.charged,
            detect_s=detect,
            stop_s=stopped_mono - t0_mono,
            rendezvous_s=rendezvous_mono - stopped_mono,
            spawn_s=started_mono - rendezvous_mono,
            total_s=started_mono - noticed_mono,
            failure_noticed=noticed,
            workers_stopped=stopped,
            rendezvous_done=rendezvous_done,
            workers_started=started,
        )
    )
