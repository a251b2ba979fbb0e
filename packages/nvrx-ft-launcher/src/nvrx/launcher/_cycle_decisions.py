"""What the agent decides with, and what it journals of a decision: pure functions.

The agent asks the coordinator to decide a cycle with a *decider* (:func:`decider`: the
policy applied to the job state, with the progress marker before and after a failed
cycle); a rank's request is its trigger (:func:`request_trigger`). A decision in force
is journalled as :func:`decision_taken` says, and a restart is logged with its budget
(:func:`restart_line`).
"""

from __future__ import annotations

from collections.abc import Callable

from ._coordination import Decision, JobState
from ._cycle_end import End
from ._cycle_state import CycleState
from ._events import DecisionTaken
from ._policy import Progress, RestartPolicy, Trigger, decide, leaves_job, trigger_of
from ._progress import read_progress
from .exit_codes import ExitCode

__all__: list[str] = []


def request_trigger(cycle: CycleState, node: str) -> tuple[Trigger, str, bool] | None:
    """A rank's request in ``cycle``: its trigger, the reason, whether this node leaves.

    A ShutdownWorkload request wins over an ExcludeThisNode one; None when no rank asked.
    """
    shutdown = cycle.shutdown_request
    if shutdown is not None:
        reason = (
            f"rank {shutdown.rank} on node {node} requested ShutdownWorkload: "
            f"{shutdown.description}"
        )
        return Trigger.SHUTDOWN_REQUEST, reason, False
    exclude = cycle.exclude_request
    if exclude is not None:
        reason = f"rank {exclude.rank} asked to exclude node {node}: {exclude.description}"
        return Trigger.EXCLUDE_REQUEST, reason, True
    return None


def end_trigger(end: End, cycle: CycleState, node: str) -> tuple[Trigger, str, bool]:
    """The trigger, reason and whether this node leaves, for an ``end`` this node decides
    on its own observation: a rank's request, torch's D-state check, nodes waiting.

    A ``FAILURE`` (its reason names the failed ranks), a ``SUCCESS`` (the exit barrier)
    and ``FOLLOW`` (the decision exists) are the agent's, not here: ValueError.
    """
    if end in (End.SHUTDOWN_REQUEST, End.EXCLUDE_REQUEST):
        request = request_trigger(cycle, node)
        if request is None:
            raise ValueError(f"{end.value} without a rank's request")
        return request
    if end is End.UNINTERRUPTIBLE:
        # A wedged rank holds a kernel resource (GPU, NIC) a new rank on this node would
        # conflict with, so this node leaves the job.
        reason = (
            f"a rank on node {node} stayed in uninterruptible sleep (D-state) "
            "past TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (torch's check)"
        )
        return Trigger.EXCLUDE_REQUEST, reason, True
    if end is End.NODES_WAITING:
        return Trigger.NODES_WAITING, "new nodes are waiting to join", False
    raise ValueError(f"{end.value} has no trigger of its own")


def decider(
    trigger: Trigger,
    reason: str,
    *,
    policy: RestartPolicy,
    node: str,
    progress_before: int | None,
    repeated_error: str | None = None,
) -> Callable[[JobState], Decision]:
    """What the coordinator calls, with the job state, if this node wins the cycle.

    A failure reads the progress marker then (``progress_before``: at the cycle's start).
    """

    def make(state: JobState) -> Decision:
        progress = Progress()
        if trigger is Trigger.FAILURE and policy.tracks_progress:
            progress = Progress(before=progress_before, after=read_progress(policy.progress_file))
        return decide(
            state,
            trigger,
            policy=policy,
            node=node,
            reason=reason,
            progress=progress,
            repeated_error=repeated_error,
        )

    return make


def decision_taken(
    decision: Decision,
    node: str,
    *,
    cycle: int,
    noticed: float,
    exclusion_requested: bool,
) -> tuple[DecisionTaken, int]:
    """The journal record of ``decision`` as this node follows it, and its exit code.

    This node leaves (``exclude``, exit 3) when the decision excludes it or it asked to.
    """
    excluded = leaves_job(decision, node, requested=exclusion_requested)
    action = "exclude" if excluded else decision.action.value
    exit_code = int(ExitCode.NODE_EXCLUDED) if excluded else decision.exit_code
    record = DecisionTaken(
        cycle=cycle,
        action=action,
        reason=decision.reason,
        decided_by=decision.node,
        charged=decision.charged,
        restart_count=decision.state.cycle,
        restarts_charged=decision.state.charged,
        exit_code=None if action == "restart" else exit_code,
        failure_noticed=noticed,
        trigger=trigger_of(decision).value,
    )
    return record, exit_code


def restart_line(decision: Decision, cycle: int, node: str, max_restarts: int) -> str:
    """The log line of a restart: its budget, the cycles, who decided, why."""
    budget = (
        f"restart {decision.state.charged}/{max_restarts}"
        if decision.charged
        else "restart (not charged to --max-restarts)"
    )
    who = "decided here" if decision.node == node else f"decided by {decision.node}"
    return f"{budget}, cycle {cycle} -> {decision.state.cycle}, {who}: {decision.reason}"
