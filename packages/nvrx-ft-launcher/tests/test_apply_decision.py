"""Applying a cycle's decision on this node: the order of torch's steps and the records.

The torch glue is the seam (:class:`TorchSteps`): each step is recorded here in the
order the decision runs them; the journal is a real one, read back.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from nvrx.launcher._apply_decision import TorchSteps, apply_decision
from nvrx.launcher._coordination import Action, Decision, JobState, StopCause
from nvrx.launcher._cycle_state import CycleState
from nvrx.launcher._events import Recorder
from nvrx.launcher._launcher_exit import LauncherExit
from nvrx.launcher.exit_codes import ExitCode
from nvrx.launcher.journal import JsonLines


class _Torch:
    """Torch's steps as the agent gives them, each noted when called."""

    def __init__(self, *, rendezvous_error: BaseException | None = None) -> None:
        self.calls: list[str] = []
        self.state: JobState | None = None
        self._error = rendezvous_error

    def steps(self) -> TorchSteps:
        def rendezvous(state: JobState) -> None:
            self.calls.append("rendezvous")
            self.state = state
            if self._error is not None:
                raise self._error

        return TorchSteps(
            stop_workers=lambda: self.calls.append("stop_workers"),
            leave_rendezvous=lambda: self.calls.append("leave_rendezvous"),
            end_job=lambda: self.calls.append("end_job"),
            rendezvous=rendezvous,
            start_workers=lambda: self.calls.append("start_workers"),
        )


def _apply(
    tmp_path: pathlib.Path, decision: Decision, torch: _Torch, *, requested: bool = False
) -> list[dict[str, object]]:
    journal = tmp_path / "journal.jsonl"
    recorder = Recorder(JsonLines(journal, node="b"), JsonLines(None))
    cycle = CycleState(number=3, started=0.0, progress=None)
    try:
        apply_decision(
            decision,
            cycle,
            torch.steps(),
            noticed=100.0,
            node="b",
            recorder=recorder,
            max_restarts=5,
            exclusion_requested=requested,
        )
    finally:
        records = [json.loads(line) for line in journal.read_text().splitlines()]
    return records


def test_a_restart_stops_joins_and_starts_with_each_phase_timed(tmp_path: pathlib.Path) -> None:
    torch = _Torch()
    restart = Decision(Action.RESTART, "boom", "a", JobState(cycle=4, charged=1), charged=True)
    records = _apply(tmp_path, restart, torch)
    assert torch.calls == ["stop_workers", "rendezvous", "start_workers"]
    assert torch.state == JobState(cycle=4, charged=1)  # the decision's state is adopted
    assert [r["event"] for r in records] == ["decision", "workers_stopped", "restart"]
    done = records[-1]
    assert (done["from_cycle"], done["cycle"], done["charged"]) == (3, 4, True)
    assert done["failure_noticed"] == 100.0
    for phase in ("stop_s", "rendezvous_s", "spawn_s", "total_s"):
        took = done[phase]
        assert isinstance(took, float)
        assert took >= 0


def test_a_failed_rendezvous_is_journalled_and_raised(tmp_path: pathlib.Path) -> None:
    torch = _Torch(rendezvous_error=TimeoutError("join timed out"))
    restart = Decision(Action.RESTART, "boom", "a", JobState(cycle=4, charged=1), charged=True)
    with pytest.raises(TimeoutError):
        _apply(tmp_path, restart, torch)
    assert torch.calls == ["stop_workers", "rendezvous"]
    records = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "restart_failed"
    assert records[-1]["error"] == "TimeoutError: join timed out"


def test_a_stop_ends_the_job_here_with_its_exit_code(tmp_path: pathlib.Path) -> None:
    torch = _Torch()
    stop = Decision(
        Action.STOP, "out", "a", JobState(cycle=3), stop_cause=StopCause.RESTARTS_EXHAUSTED
    )
    with pytest.raises(LauncherExit) as raised:
        _apply(tmp_path, stop, torch)
    assert raised.value.code == int(ExitCode.RESTARTS_EXHAUSTED)
    assert torch.calls == ["stop_workers", "end_job"]


def test_a_node_that_asked_to_leave_leaves_the_rendezvous_with_exit_3(
    tmp_path: pathlib.Path,
) -> None:
    torch = _Torch()
    restart = Decision(Action.RESTART, "excluded b", "b", JobState(cycle=4), charged=False)
    with pytest.raises(LauncherExit) as raised:
        _apply(tmp_path, restart, torch, requested=True)
    assert raised.value.code == int(ExitCode.NODE_EXCLUDED)
    assert torch.calls == ["stop_workers", "leave_rendezvous"]
    records = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["decision", "workers_stopped"]
    assert (records[0]["action"], records[0]["exit_code"]) == ("exclude", 3)
