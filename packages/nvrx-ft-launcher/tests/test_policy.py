"""The restart policy, rule by rule, without processes."""

from __future__ import annotations

import pytest

from nvrx.launcher._coordination import Action, JobState, StopCause
from nvrx.launcher._policy import (
    Progress,
    RestartPolicy,
    Trigger,
    decide,
    leaves_job,
    trigger_of,
)
from nvrx.launcher.exit_codes import ExitCode

BUDGET = RestartPolicy(
    max_restarts=2, workers_stop_timeout=5, max_no_progress_restarts=0, min_progress_iterations=1
)
PROGRESS = RestartPolicy(
    max_restarts=10,
    workers_stop_timeout=5,
    max_no_progress_restarts=2,
    min_progress_iterations=10,
    progress_file="/run/progress",
)


def test_a_failure_within_budget_restarts_charged() -> None:
    d = decide(JobState(3, 1, 0), Trigger.FAILURE, policy=BUDGET, node="n", reason="why")
    assert (d.action, d.charged, d.state) == (Action.RESTART, True, JobState(4, 2, 0))
    assert d.node == "n"
    assert d.reason == "why"
    assert d.excluded_node is None


def test_a_failure_with_the_budget_spent_stops_with_exit_1() -> None:
    d = decide(JobState(5, 2, 0), Trigger.FAILURE, policy=BUDGET, node="n", reason="why")
    assert (d.action, d.stop_cause, d.exit_code) == (
        Action.STOP,
        StopCause.RESTARTS_EXHAUSTED,
        ExitCode.RESTARTS_EXHAUSTED,
    )
    assert d.state == JobState(5, 2, 0)  # nothing moves on a stop
    assert d.reason == "why; no restarts left (2/2 used)"


def test_zero_max_restarts_stops_at_the_first_failure() -> None:
    policy = RestartPolicy(0, 5, 0, 1)
    d = decide(JobState(), Trigger.FAILURE, policy=policy, node="n", reason="r")
    assert d.action is Action.STOP


@pytest.mark.parametrize("trigger", [Trigger.EXCLUDE_REQUEST, Trigger.NODES_WAITING])
def test_exclusion_and_joining_nodes_restart_free_even_with_the_budget_spent(
    trigger: Trigger,
) -> None:
    d = decide(JobState(7, 2, 1), trigger, policy=BUDGET, node="n", reason="r")
    assert (d.action, d.charged, d.state) == (Action.RESTART, False, JobState(8, 2, 1))
    assert d.excluded_node == ("n" if trigger is Trigger.EXCLUDE_REQUEST else None)


def test_shutdown_request_shuts_down_with_exit_4() -> None:
    d = decide(JobState(1, 2, 0), Trigger.SHUTDOWN_REQUEST, policy=BUDGET, node="n", reason="r")
    assert (d.action, d.exit_code, d.state) == (
        Action.SHUTDOWN,
        ExitCode.WORKLOAD_SHUTDOWN,
        JobState(1, 2, 0),
    )


def test_progress_resets_the_streak() -> None:
    d = decide(
        JobState(4, 4, 2),
        Trigger.FAILURE,
        policy=PROGRESS,
        node="n",
        reason="r",
        progress=Progress(before=100, after=110),
    )
    assert (d.action, d.state) == (Action.RESTART, JobState(5, 5, 0))


def test_no_progress_counts_then_stops_with_exit_93() -> None:
    state = JobState()
    stalled = Progress(before=100, after=105)  # moved, but less than 10 iterations
    for expected in (1, 2):
        d = decide(state, Trigger.FAILURE, policy=PROGRESS, node="n", reason="r", progress=stalled)
        assert d.action is Action.RESTART
        assert d.state.no_progress == expected
        state = d.state
    d = decide(state, Trigger.FAILURE, policy=PROGRESS, node="n", reason="r", progress=stalled)
    assert (d.action, d.stop_cause, d.exit_code) == (
        Action.STOP,
        StopCause.NO_PROGRESS,
        ExitCode.NO_PROGRESS,
    )
    assert d.state == JobState(2, 2, 3)
    assert "no progress in /run/progress (still 105) across 2 restart(s)" in d.reason


def test_an_unknown_marker_is_no_progress_and_a_first_marker_is_progress() -> None:
    unknown = decide(
        JobState(), Trigger.FAILURE, policy=PROGRESS, node="n", reason="r", progress=Progress()
    )
    assert unknown.state.no_progress == 1
    first = decide(
        JobState(1, 1, 1),
        Trigger.FAILURE,
        policy=PROGRESS,
        node="n",
        reason="r",
        progress=Progress(before=None, after=3),
    )
    assert first.state.no_progress == 0


def test_the_budget_is_checked_before_progress() -> None:
    policy = RestartPolicy(1, 5, 1, 1, progress_file="/p")
    d = decide(
        JobState(1, 1, 1), Trigger.FAILURE, policy=policy, node="n", reason="r", progress=Progress()
    )
    assert d.stop_cause is StopCause.RESTARTS_EXHAUSTED


def test_without_a_progress_file_the_rule_is_off() -> None:
    policy = RestartPolicy(10, 5, 1, 1, progress_file=None)
    assert not policy.tracks_progress
    state = JobState()
    for _ in range(5):
        state = decide(state, Trigger.FAILURE, policy=policy, node="n", reason="r").state
    assert state == JobState(5, 5, 0)


@pytest.mark.parametrize("trigger", list(Trigger))
@pytest.mark.parametrize("state", [JobState(), JobState(3, 2, 0)])
def test_the_trigger_can_be_read_back_from_any_decision(trigger: Trigger, state: JobState) -> None:
    d = decide(state, trigger, policy=BUDGET, node="n", reason="r")
    assert trigger_of(d) is trigger


def test_a_node_that_asked_to_leave_follows_a_stop_or_shutdown_another_node_won() -> None:
    """ExcludeThisNode leaves the job only when the winning decision restarts the others."""
    state = JobState(2, 2, 0)
    stop = decide(state, Trigger.FAILURE, policy=BUDGET, node="other", reason="crash")
    shutdown = decide(state, Trigger.SHUTDOWN_REQUEST, policy=BUDGET, node="other", reason="r")
    restart = decide(JobState(), Trigger.FAILURE, policy=BUDGET, node="other", reason="crash")
    mine = decide(state, Trigger.EXCLUDE_REQUEST, policy=BUDGET, node="me", reason="r")
    assert stop.action is Action.STOP
    assert not leaves_job(stop, "me", requested=True)
    assert not leaves_job(shutdown, "me", requested=True)
    assert leaves_job(restart, "me", requested=True)
    assert not leaves_job(restart, "me", requested=False)
    assert leaves_job(mine, "me", requested=True)
    assert leaves_job(mine, "me", requested=False)  # the decision names it
    assert not leaves_job(mine, "other", requested=False)
