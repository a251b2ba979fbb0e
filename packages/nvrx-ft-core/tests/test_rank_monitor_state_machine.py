"""NVRx's restart state machine, provided for code that imports it: events and transitions."""

from __future__ import annotations

import logging

import pytest

from nvrx.ft import InvalidStateTransitionException, RankMonitorState, RankMonitorStateMachine

pytestmark = pytest.mark.timeout(30)

S = RankMonitorState


def machine_in(state: RankMonitorState) -> RankMonitorStateMachine:
    m = RankMonitorStateMachine()
    m.state = state
    return m


@pytest.mark.parametrize(
    ("event", "start", "end"),
    [
        ("handle_heartbeat_msg", S.UNINITIALIZED, S.INITIALIZE),
        ("handle_section_msg", S.UNINITIALIZED, S.INITIALIZE),
        ("handle_heartbeat_msg", S.INITIALIZE, S.INITIALIZE),
        ("handle_heartbeat_msg", S.HANDLING_START, S.HANDLING_COMPLETED),
        ("handle_heartbeat_msg", S.HANDLING_PROCESSING, S.HANDLING_COMPLETED),
        ("handle_heartbeat_msg", S.HANDLING_COMPLETED, S.HANDLING_COMPLETED),
        ("periodic_restart_check", S.HANDLING_START, S.HANDLING_PROCESSING),
        ("periodic_restart_check", S.HANDLING_PROCESSING, S.HANDLING_PROCESSING),
        ("handle_ipc_connection_lost", S.INITIALIZE, S.HANDLING_START),
        ("handle_ipc_connection_lost", S.HANDLING_COMPLETED, S.HANDLING_START),
        ("handle_ipc_connection_lost", S.HANDLING_START, S.ABORTED),
        ("handle_ipc_connection_lost", S.HANDLING_PROCESSING, S.ABORTED),
        ("handle_ipc_connection_lost", S.ABORTED, S.ABORTED),
        ("handle_ipc_connection_lost", S.UNINITIALIZED, S.UNINITIALIZED),
        ("handle_ipc_connection_lost", S.FINALIZED, S.FINALIZED),
        ("handle_signal", S.UNINITIALIZED, S.UNINITIALIZED),
        ("handle_signal", S.INITIALIZE, S.FINALIZED),
        ("handle_signal", S.HANDLING_START, S.ABORTED),
        ("handle_signal", S.HANDLING_COMPLETED, S.FINALIZED),
        ("handle_signal", S.ABORTED, S.FINALIZED),
        ("handle_signal", S.FINALIZED, S.FINALIZED),
    ],
)
def test_each_event_moves_the_machine(
    event: str, start: RankMonitorState, end: RankMonitorState
) -> None:
    m = machine_in(start)
    getattr(m, event)()
    assert m.state is end


@pytest.mark.parametrize(
    ("event", "start"),
    [
        ("handle_heartbeat_msg", S.FINALIZED),
        ("handle_heartbeat_msg", S.ABORTED),
        ("periodic_restart_check", S.INITIALIZE),
        ("periodic_restart_check", S.UNINITIALIZED),
    ],
)
def test_an_event_the_state_refuses_raises(event: str, start: RankMonitorState) -> None:
    m = machine_in(start)
    with pytest.raises(InvalidStateTransitionException):
        getattr(m, event)()
    assert m.state is start


def test_a_restart_cycle_and_the_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    m = RankMonitorStateMachine(is_restarter_logger=True)
    caplog.set_level(logging.INFO, "nvrx.ft.restarter")
    m.handle_heartbeat_msg()
    m.handle_ipc_connection_lost()
    assert m.is_restarting()
    m.periodic_restart_check()
    m.handle_heartbeat_msg()
    assert not m.is_restarting()
    m.handle_signal()
    assert m.state is S.FINALIZED
    assert [r.getMessage() for r in caplog.records] == [
        "[NestedRestarter] name=[InJob] state=initialize",
        "[NestedRestarter] name=[InJob] state=handling stage=starting",
        "[NestedRestarter] name=[InJob] state=handling stage=processing",
        "[NestedRestarter] name=[InJob] state=handling stage=completed",
        "[NestedRestarter] name=[InJob] state=finalized",
    ]


def test_transition_to_checks_the_table() -> None:
    m = RankMonitorStateMachine()
    assert m.can_transition_to(S.INITIALIZE)
    assert not m.can_transition_to(S.ABORTED)
    with pytest.raises(InvalidStateTransitionException, match="UNINITIALIZED to"):
        m.transition_to(S.ABORTED)
    m.transition_to(S.FINALIZED)
    assert m.state is S.FINALIZED
