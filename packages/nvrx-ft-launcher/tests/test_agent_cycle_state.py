"""What the agent keeps for a cycle: workload control requests survive until a decision."""

from __future__ import annotations

from nvrx.ft._events import WorkloadRequest
from nvrx.launcher._cycle_state import CycleState, RankPids


def _request(action: str, rank: int) -> WorkloadRequest:
    return WorkloadRequest(
        local_rank=rank, rank=rank, pid=100 + rank, action=action, description=f"from {rank}"
    )


def test_requests_are_kept_for_the_cycle_first_of_each_kind() -> None:
    """A request drained while the agent waits for hang evidence is still acted on after."""
    cycle = CycleState(number=3, started=0.0, progress=None)
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


def test_an_earlier_cycles_rank_pid_is_stale() -> None:
    """A late event from the previous cycle's rank does not count in the next cycle."""
    pids = RankPids()
    pids.new_cycle([100, 101])
    assert not pids.is_stale(100)
    assert not pids.is_stale(150), "a pid the monitor reports first is this cycle's"
    pids.new_cycle([200, 201])
    assert pids.is_stale(100)
    assert pids.is_stale(101)
    assert pids.is_stale(150)
    assert not pids.is_stale(200)
    pids.new_cycle([300, 101])
    assert not pids.is_stale(101), "a pid reused by the new cycle's rank is its own"
    assert pids.is_stale(200)
    assert pids.is_stale(100)
