"""What the agent keeps for a cycle: workload control requests survive until a decision."""

from __future__ import annotations

from nvrx.ft import MonitorEvent
from nvrx.launcher._agent import _Cycle


def _request(action: str, rank: int) -> MonitorEvent:
    return MonitorEvent(
        "workload_control", rank, rank, 100 + rank, action=action, description=f"from {rank}"
    )


def test_requests_are_kept_for_the_cycle_first_of_each_kind() -> None:
    """A request drained while the agent waits for hang evidence is still acted on after."""
    cycle = _Cycle(number=3, started=0.0, progress=None)
    assert (cycle.shutdown_request, cycle.exclude_request) == (None, None)
    cycle.note_request(_request("ExcludeThisNode", 1))
    cycle.note_request(_request("ShutdownWorkload", 2))
    cycle.note_request(_request("ShutdownWorkload", 0))
    cycle.note_request(_request("ExcludeThisNode", 3))
    cycle.note_request(_request("SomethingElse", 4))
    assert cycle.shutdown_request is not None
    assert cycle.shutdown_request.rank == 2
    assert cycle.exclude_request is not None
    assert cycle.exclude_request.rank == 1
