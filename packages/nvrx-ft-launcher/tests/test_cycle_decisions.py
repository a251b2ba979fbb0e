"""What the agent decides with and journals of a decision (pure functions)."""

from __future__ import annotations

import pytest

from nvrx.ft._events import WorkloadRequest
from nvrx.launcher._coordination import Action, Decision, JobState, StopCause
from nvrx.launcher._cycle_decisions import (
    decision_taken,
    end_trigger,
    request_trigger,
    restart_line,
)
from nvrx.launcher._cycle_end import End
from nvrx.launcher._cycle_state import CycleState
from nvrx.launcher._policy import Trigger
from nvrx.launcher.exit_codes import ExitCode


def _request(action: str, rank: int) -> WorkloadRequest:
    return WorkloadRequest(
        local_rank=0,
        rank=rank,
        pid=10 + rank,
        action=action,
        description="why",
    )


def test_a_shutdown_request_wins_over_an_exclusion_and_no_request_is_none() -> None:
    cycle = CycleState(number=2, started=0.0, progress=None)
    assert request_trigger(cycle, "n") is None
    cycle.note_request(_request("ExcludeThisNode", 1))
    assert request_trigger(cycle, "n") == (
        Trigger.EXCLUDE_REQUEST,
        "rank 1 asked to exclude node n: why",
        True,
    )
    cycle.note_request(_request("ShutdownWorkload", 3))
    assert request_trigger(cycle, "n") == (
        Trigger.SHUTDOWN_REQUEST,
        "rank 3 on node n requested ShutdownWorkload: why",
        False,
    )


def test_each_end_this_node_decides_alone_has_its_trigger_reason_and_leaving() -> None:
    cycle = CycleState(number=2, started=0.0, progress=None)
    assert end_trigger(End.NODES_WAITING, cycle, "n") == (
        Trigger.NODES_WAITING,
        "new nodes are waiting to join",
        False,
    )
    trigger, reason, leaves = end_trigger(End.UNINTERRUPTIBLE, cycle, "n")
    assert (trigger, leaves) == (Trigger.EXCLUDE_REQUEST, True)
    assert "node n stayed in uninterruptible sleep (D-state)" in reason
    with pytest.raises(ValueError, match="without a rank's request"):
        end_trigger(End.SHUTDOWN_REQUEST, cycle, "n")
    cycle.note_request(_request("ExcludeThisNode", 1))
    assert end_trigger(End.EXCLUDE_REQUEST, cycle, "n") == request_trigger(cycle, "n")
    # A request of either kind is decided as the winning request (shutdown first).
    cycle.note_request(_request("ShutdownWorkload", 3))
    assert end_trigger(End.EXCLUDE_REQUEST, cycle, "n")[0] is Trigger.SHUTDOWN_REQUEST
    for end in (End.FOLLOW, End.FAILURE, End.SUCCESS):
        with pytest.raises(ValueError, match="no trigger of its own"):
            end_trigger(end, cycle, "n")


def test_the_journal_record_of_a_restart_a_stop_and_an_exclusion() -> None:
    restart = Decision(Action.RESTART, "boom", "a", JobState(cycle=4, charged=1), charged=True)
    taken, code = decision_taken(restart, "b", cycle=3, noticed=5.0, exclusion_requested=False)
    assert (taken.action, taken.exit_code, code) == ("restart", None, 0)
    assert (taken.decided_by, taken.restart_count, taken.restarts_charged) == ("a", 4, 1)
    assert (taken.cycle, taken.failure_noticed, taken.trigger) == (3, 5.0, "failure")
    # The node that asked to leave is excluded (exit 3) by the decision it caused.
    taken, code = decision_taken(restart, "b", cycle=3, noticed=5.0, exclusion_requested=True)
    assert (taken.action, taken.exit_code, code) == ("exclude", 3, int(ExitCode.NODE_EXCLUDED))
    stop = Decision(
        Action.STOP, "out", "a", JobState(cycle=3), stop_cause=StopCause.RESTARTS_EXHAUSTED
    )
    taken, code = decision_taken(stop, "b", cycle=3, noticed=5.0, exclusion_requested=False)
    assert (taken.action, code) == ("stop", int(ExitCode.RESTARTS_EXHAUSTED))


def test_the_restart_line_says_the_budget_and_who_decided() -> None:
    charged = Decision(Action.RESTART, "boom", "a", JobState(cycle=4, charged=2), charged=True)
    assert restart_line(charged, 3, "a", 5) == "restart 2/5, cycle 3 -> 4, decided here: boom"
    free = Decision(Action.RESTART, "waiting", "a", JobState(cycle=4))
    assert restart_line(free, 3, "b", 5) == (
        "restart (not charged to --max-restarts), cycle 3 -> 4, decided by a: waiting"
    )
