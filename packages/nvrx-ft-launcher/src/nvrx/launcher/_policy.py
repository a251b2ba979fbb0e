"""What happens after a cycle ends badly: the launcher's restart policy, as a pure function.

:func:`decide` maps the job state (restarts used and charged, the no-progress streak),
what ended the cycle (:class:`Trigger`), the progress marker before and after it, and
the limits from the command line (:class:`RestartPolicy`) to the :class:`Decision` every
node follows. It reads no file, no clock and no store, so each rule is tested case by
case without processes (``tests/test_policy.py``); the agent gathers the inputs and
publishes the result through :class:`~nvrx.launcher._coordination.JobCoordinator`.

The rules, in order:

- a rank asked to shut the workload down: shut down (exit 4), whatever the budget;
- a rank asked to exclude its node, or new nodes wait to join: restart without charging
  the budget (the excluded node leaves, exit 3);
- a failure that repeats the previous cycle's deterministic failure (the same exception
  at the same source line before the first step, see :mod:`._deterministic`), unless
  ``stop_on_repeated_error`` is off: stop (exit 6), whatever the budget;
- a failure with the budget spent: stop (exit 1);
- a failure after ``max_no_progress_restarts`` charged restarts in a row that did not
  move the progress marker by ``min_progress_iterations``: stop (exit 93);
- any other failure: restart, charged to the budget.
"""

from __future__ import annotations

import dataclasses
import enum

from ._coordination import Action, Decision, JobState, StopCause
from ._progress import made_progress

__all__ = ["Progress", "RestartPolicy", "Trigger", "decide", "leaves_job", "trigger_of"]


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """How the agent restarts, stops and reports; built from the command line."""

    max_restarts: int
    workers_stop_timeout: float
    max_no_progress_restarts: int
    min_progress_iterations: int
    progress_file: str | None = None
    exit_barrier_timeout: float = 300.0
    #: Stop when two consecutive cycles fail deterministically (see ._deterministic).
    stop_on_repeated_error: bool = True

    @property
    def tracks_progress(self) -> bool:
        """True when the progress rule is on (a progress file and a limit above 0)."""
        return self.max_no_progress_restarts > 0 and self.progress_file is not None


class Trigger(enum.Enum):
    """What ended the cycle."""

    #: A rank failed, its monitor terminated it, or a watching monitor died.
    FAILURE = "failure"
    #: A rank asked to exclude its node (ExcludeThisNode).
    EXCLUDE_REQUEST = "exclude_request"
    #: A rank asked to shut the workload down (ShutdownWorkload).
    SHUTDOWN_REQUEST = "shutdown_request"
    #: Nodes wait in the rendezvous to join the job.
    NODES_WAITING = "nodes_waiting"


@dataclasses.dataclass(frozen=True)
class Progress:
    """The progress marker when the cycle started and now (None: unknown)."""

    before: int | None = None
    after: int | None = None


def trigger_of(decision: Decision) -> Trigger:
    """What ended the cycle, read back from a decision (whichever node made it).

    :func:`decide` gives each trigger its own kind of decision, so this inverts it.
    """
    if decision.action is Action.SHUTDOWN:
        return Trigger.SHUTDOWN_REQUEST
    if decision.action is Action.STOP or decision.charged:
        return Trigger.FAILURE
    if decision.excluded_node is not None:
        return Trigger.EXCLUDE_REQUEST
    return Trigger.NODES_WAITING


def leaves_job(decision: Decision, node: str, *, requested: bool) -> bool:
    """Whether ``node`` leaves the job (exit 3) on ``decision``.

    It does when the decision excludes it, or when it asked to leave (``requested``:
    ExcludeThisNode, or torch's D-state check) and the decision that won the cycle
    restarts the others. A stop or shutdown decided by another node wins over the
    request: every node then ends with that decision's exit code.
    """
    if decision.excluded_node == node:
        return True
    return requested and decision.action is Action.RESTART


def decide(
    state: JobState,
    trigger: Trigger,
    *,
    policy: RestartPolicy,
    node: str,
    reason: str,
    progress: Progress = Progress(),
    repeated_error: str | None = None,
) -> Decision:
    """The decision for the cycle ``state.cycle``, decided by ``node``; see the module doc.

    ``repeated_error``: the one-line root cause when this cycle's failure repeats the
    previous cycle's deterministic failure (:func:`._deterministic.repeats`), else None.
    """
    if trigger is Trigger.SHUTDOWN_REQUEST:
        return Decision(Action.SHUTDOWN, reason, node, state)
    if trigger is not Trigger.FAILURE:
        excluded = node if trigger is Trigger.EXCLUDE_REQUEST else None
        after = dataclasses.replace(state, cycle=state.cycle + 1)
        return Decision(Action.RESTART, reason, node, after, excluded_node=excluded)
    if repeated_error is not None and policy.stop_on_repeated_error:
        return Decision(
            Action.STOP,
            f"{reason}; deterministic failure, the same in two cycles in a row before their "
            f"first step: {repeated_error} (restarting cannot help; "
            "--ft-stop-on-repeated-error=false restarts anyway)",
            node,
            state,
            StopCause.DETERMINISTIC_FAILURE,
        )
    if state.charged >= policy.max_restarts:
        return Decision(
            Action.STOP,
            f"{reason}; no restarts left ({state.charged}/{policy.max_restarts} used)",
            node,
            state,
            StopCause.RESTARTS_EXHAUSTED,
        )
    no_progress = state.no_progress
    if policy.tracks_progress:
        if made_progress(progress.before, progress.after, policy.min_progress_iterations):
            no_progress = 0
        else:
            no_progress += 1
        if no_progress > policy.max_no_progress_restarts:
            return Decision(
                Action.STOP,
                f"{reason}; no progress in {policy.progress_file} (still {progress.after}) "
                f"across {policy.max_no_progress_restarts} restart(s)",
                node,
                dataclasses.replace(state, no_progress=no_progress),
                StopCause.NO_PROGRESS,
            )
    return Decision(
        Action.RESTART,
        reason,
        node,
        JobState(cycle=state.cycle + 1, charged=state.charged + 1, no_progress=no_progress),
        charged=True,
    )
