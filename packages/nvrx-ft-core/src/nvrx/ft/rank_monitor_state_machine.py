"""NVRx's in-job restart state machine of a rank monitor, for code that imports it.

NVRx's monitor drives this machine to print its "[NestedRestarter]" log lines; nvrx's
monitor tracks the same life (first message, connection lost, restart handled,
finished or aborted) in its own events and journal, so nothing in nvrx drives this
class. It is provided with NVRx's names, states, events and allowed transitions so
that code and tests written against
``nvidia_resiliency_ext.fault_tolerance.rank_monitor_state_machine`` keep working:
each event method moves the machine as NVRx's does, and an event that is not allowed
in the current state raises :class:`InvalidStateTransitionException` (NVRx raises an
AssertionError for some of them; here every refusal is the one exception).
"""

from __future__ import annotations

import enum
import logging

__all__ = ["InvalidStateTransitionException", "RankMonitorState", "RankMonitorStateMachine"]

_logger = logging.getLogger("nvrx.ft.restarter")


class InvalidStateTransitionException(Exception):
    """An event or a transition that the current state does not allow."""


class RankMonitorState(enum.Enum):
    """Where a rank monitor is in the life of its rank across in-job restarts."""

    UNINITIALIZED = enum.auto()
    INITIALIZE = enum.auto()
    HANDLING_START = enum.auto()
    HANDLING_PROCESSING = enum.auto()
    HANDLING_COMPLETED = enum.auto()
    FINALIZED = enum.auto()
    ABORTED = enum.auto()


_S = RankMonitorState
#: Every transition the machine may make (a state not listed as a target is refused).
ALLOWED: dict[RankMonitorState, frozenset[RankMonitorState]] = {
    _S.UNINITIALIZED: frozenset({_S.INITIALIZE, _S.FINALIZED}),
    _S.INITIALIZE: frozenset({_S.HANDLING_START, _S.FINALIZED}),
    _S.HANDLING_START: frozenset({_S.HANDLING_COMPLETED, _S.HANDLING_PROCESSING, _S.ABORTED}),
    _S.HANDLING_PROCESSING: frozenset({_S.HANDLING_COMPLETED, _S.HANDLING_PROCESSING, _S.ABORTED}),
    _S.HANDLING_COMPLETED: frozenset({_S.HANDLING_START, _S.FINALIZED}),
    _S.ABORTED: frozenset({_S.FINALIZED}),
    _S.FINALIZED: frozenset({_S.FINALIZED}),
}
_HANDLING = frozenset({_S.HANDLING_START, _S.HANDLING_PROCESSING})
#: What each event does in each state: the next state, or None to stay (ignored).
#: A state missing from an event's row refuses that event.
_ON_MESSAGE: dict[RankMonitorState, RankMonitorState | None] = {
    _S.UNINITIALIZED: _S.INITIALIZE,
    _S.HANDLING_START: _S.HANDLING_COMPLETED,
    _S.HANDLING_PROCESSING: _S.HANDLING_COMPLETED,
    _S.INITIALIZE: None,
    _S.HANDLING_COMPLETED: None,
}
_ON_RESTART_CHECK: dict[RankMonitorState, RankMonitorState | None] = {
    _S.HANDLING_START: _S.HANDLING_PROCESSING,
    _S.HANDLING_PROCESSING: _S.HANDLING_PROCESSING,
}
_ON_CONNECTION_LOST: dict[RankMonitorState, RankMonitorState | None] = {
    _S.INITIALIZE: _S.HANDLING_START,
    _S.HANDLING_COMPLETED: _S.HANDLING_START,
    _S.HANDLING_START: _S.ABORTED,
    _S.HANDLING_PROCESSING: _S.ABORTED,
    _S.ABORTED: None,
    _S.UNINITIALIZED: None,
    _S.FINALIZED: None,
}
_ON_SIGNAL: dict[RankMonitorState, RankMonitorState | None] = {
    _S.UNINITIALIZED: None,
    _S.HANDLING_START: _S.ABORTED,
    _S.HANDLING_PROCESSING: _S.ABORTED,
    _S.INITIALIZE: _S.FINALIZED,
    _S.HANDLING_COMPLETED: _S.FINALIZED,
    _S.ABORTED: _S.FINALIZED,
    _S.FINALIZED: _S.FINALIZED,
}
#: The log line of each state entered, in NVRx's format (dashboards grep for it).
_LINES = {
    _S.INITIALIZE: "state=initialize",
    _S.HANDLING_START: "state=handling stage=starting",
    _S.HANDLING_PROCESSING: "state=handling stage=processing",
    _S.HANDLING_COMPLETED: "state=handling stage=completed",
    _S.FINALIZED: "state=finalized",
    _S.ABORTED: "state=aborted",
}


class RankMonitorStateMachine:
    """One rank monitor's restart state; ``is_restarter_logger`` logs each state entered."""

    def __init__(self, is_restarter_logger: bool = False) -> None:
        self.state = RankMonitorState.UNINITIALIZED
        self.is_restarter_logger = is_restarter_logger

    def is_restarting(self) -> bool:
        """Whether a restart is being handled (started, not yet completed)."""
        return self.state in _HANDLING

    def handle_heartbeat_msg(self) -> None:
        """A heartbeat arrived: the first one initializes, one after a restart completes it."""
        self._on("heartbeat", _ON_MESSAGE)

    def handle_section_msg(self) -> None:
        """A section message arrived: the same as a heartbeat."""
        self._on("section message", _ON_MESSAGE)

    def periodic_restart_check(self) -> None:
        """A restart is still being handled (only allowed while one is)."""
        self._on("periodic restart check", _ON_RESTART_CHECK)

    def handle_ipc_connection_lost(self) -> None:
        """The rank disconnected: a restart starts, or a second loss while handling aborts."""
        self._on("connection lost", _ON_CONNECTION_LOST)

    def handle_signal(self) -> None:
        """The monitor was signalled: finalize, or abort a restart in progress."""
        self._on("signal", _ON_SIGNAL)

    def can_transition_to(self, new_state: RankMonitorState) -> bool:
        """Whether :data:`ALLOWED` lets the current state move to ``new_state``."""
        return new_state in ALLOWED[self.state]

    def transition_to(self, new_state: RankMonitorState) -> None:
        """Move to ``new_state``; InvalidStateTransitionException if that is not allowed."""
        if not self.can_transition_to(new_state):
            raise InvalidStateTransitionException(
                f"Invalid transition attempted from {self.state} to {new_state}"
            )
        if self.is_restarter_logger:
            _logger.info("[NestedRestarter] name=[InJob] %s", _LINES[new_state])
        self.state = new_state

    def _on(self, event: str, table: dict[RankMonitorState, RankMonitorState | None]) -> None:
        if self.state not in table:
            raise InvalidStateTransitionException(f"unexpected {event} in state {self.state}")
        target = table[self.state]
        if target is not None:
            self.transition_to(target)
