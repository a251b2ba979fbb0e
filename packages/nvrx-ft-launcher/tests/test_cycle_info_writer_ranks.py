"""What a rank reads from the cycle-info file: its own cycle on every node, signals as -signum."""

from __future__ import annotations

import pathlib
import signal
from typing import Any

import pytest

from nvrx.ft import CYCLE_INFO_ENV, read_cycle_info
from nvrx.launcher._cycle_info_writer import CycleInfoWriter, signal_exit_code
from nvrx.launcher._events import (
    CycleStarted,
    DecisionTaken,
    Event,
    RankFailed,
    WorkersStopped,
)


def _record(event: Event, t: float) -> dict[str, Any]:
    """As the Recorder journals it (the sink is fed exactly that)."""
    return {**event.to_record(), "t": t}


def _started(cycle: int, group_rank: int) -> CycleStarted:
    return CycleStarted(
        cycle=cycle,
        restart_count=cycle,
        group_rank=group_rank,
        world_size=4,
        local_ranks={0: 2 * group_rank, 1: 2 * group_rank + 1},
        nodes=[{"node_id": "a", "group_rank": 0}, {"node_id": "b", "group_rank": 1}],
    )


def _failed(rank: int, exit_code: int | None, sig: str | None) -> RankFailed:
    return RankFailed(
        cycle=0,
        rank=rank,
        local_rank=rank,
        pid=1000 + rank,
        exit_code=exit_code,
        signal=sig,
        monitor_cause=None,
        section=None,
        observed_s=None,
        limit_s=None,
        root_cause=None,
    )


def _sink(directory: pathlib.Path) -> CycleInfoWriter:
    return CycleInfoWriter(str(directory), "77", 0, file_job="77")


def test_every_node_gives_its_ranks_this_cycles_file_not_the_link(tmp_path: pathlib.Path) -> None:
    writer, other = _sink(tmp_path), _sink(tmp_path)
    env0: dict[str, str] = {}
    env1: dict[str, str] = {}
    writer.export(env0)
    other.export(env1)
    for node, env, group_rank in ((writer, env0, 0), (other, env1, 1)):
        node.feed(_record(_started(0, group_rank), 100.0))
        assert env[CYCLE_INFO_ENV] == str(tmp_path / "cycle_info.77.0.0")
    # cycle 1: the other node spawns first; the link still names cycle 0
    other.feed(_record(_started(1, 1), 200.0))
    assert env1[CYCLE_INFO_ENV] == str(tmp_path / "cycle_info.77.0.1")
    assert read_cycle_info(env1[CYCLE_INFO_ENV]) is None  # not yet: never the old cycle
    current = read_cycle_info(tmp_path / "cycle_info.77.current")
    assert current is not None
    assert current.cycle == 0
    writer.feed(_record(_started(1, 0), 200.1))
    info = read_cycle_info(env1[CYCLE_INFO_ENV])
    assert info is not None
    assert info.cycle == 1


@pytest.mark.parametrize(
    ("exit_code", "sig", "expected"),
    [(1, None, 1), (None, "SIGKILL", -9), (None, "SIGSEGV", -11), (None, "40", -40)],
)
def test_a_killed_rank_has_the_negative_signal_as_exit_code(
    tmp_path: pathlib.Path, exit_code: int | None, sig: str | None, expected: int
) -> None:
    sink = _sink(tmp_path)
    sink.feed(_record(_started(0, 0), 100.0))
    sink.feed(_record(_failed(1, exit_code, sig), 101.0))
    decision = DecisionTaken(
        cycle=0,
        action="restart",
        reason="rank 1 failed",
        decided_by="a",
        charged=True,
        restart_count=1,
        restarts_charged=1,
        exit_code=None,
        failure_noticed=101.0,
        trigger="failure",
    )
    sink.feed(_record(decision, 101.1))
    sink.feed(_record(WorkersStopped(cycle=0, workers_stopped=101.5), 101.6))
    info = read_cycle_info(tmp_path / "cycle_info.77.0.0")
    assert info is not None
    assert info.exit_codes == {1: expected}
    sink.feed(_record(_started(1, 0), 102.0))
    restarted = read_cycle_info(tmp_path / "cycle_info.77.0.1")
    assert restarted is not None
    assert restarted.cause == "rank 1 failed"


def test_signal_names_map_to_their_numbers() -> None:
    assert signal_exit_code("SIGTERM") == -int(signal.SIGTERM)
    assert signal_exit_code("NOTASIGNAL") is None
    assert signal_exit_code(None) is None
