"""rank_first_step (once per init, at the first iteration's end) and the rank's process
state in hang evidence; real monitor and rank processes, real signals."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, Rank, RankFactory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]


def _wall(rank: Rank, text: str) -> float:
    rank.wait_output(text)
    for line in rank.output().splitlines():
        if line.startswith(f"{text} "):
            return float(line.split()[-1])
    raise AssertionError(f"no {text!r} line in {rank.output()}")


def _first_steps(events: Events) -> int:
    """rank_first_step events seen so far (``drain`` keeps every event seen)."""
    return sum(e.event == "rank_first_step" for e in events.drain())


def test_first_heartbeat_after_init_is_reported_once_with_its_wall_time(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=30.0, initial_rank_heartbeat_timeout=30.0))
    rank = start_rank(
        [
            ["init"],
            ["say", "inited"],
            ["sleep", 0.6],
            ["say_wall", "before"],
            ["hb"],
            ["say_wall", "after"],
            ["sleep", 0.3],  # quiet for six polls: the slot still holds the first beat
            ["beat_for", 0.5, 0.02],
            ["say", "beaten"],
            ["hang"],
        ]
    )
    rank.wait_output("inited")
    time.sleep(0.3)  # six polls of the monitor: nothing to report before the heartbeat
    assert _first_steps(events) == 0
    ev = events.wait("rank_first_step")
    before, after = _wall(rank, "before"), _wall(rank, "after")
    assert (ev.rank, ev.local_rank, ev.pid, ev.via) == (0, 0, rank.pid, "heartbeat")
    assert ev.step_wall is not None
    assert before - 0.01 <= ev.step_wall <= after + 0.01
    assert ev.since_init_s is not None
    assert ev.since_init_s >= 0.6
    rank.wait_output("beaten")
    time.sleep(0.2)
    assert _first_steps(events) == 1  # once per init, not per heartbeat


def test_first_step_section_end_is_reported_at_its_close(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_section_timeouts={"step": 30.0}))
    rank = start_rank(
        [
            ["init"],
            ["open", "step"],
            ["say", "opened"],
            ["sleep", 0.5],
            ["close", "step"],
            ["say_wall", "closed"],
            ["steps", 3, 0.05],
            ["say", "trained"],
            ["hang"],
        ]
    )
    rank.wait_output("opened")
    time.sleep(0.3)  # the first step is open: not finished yet
    assert _first_steps(events) == 0
    ev = events.wait("rank_first_step")
    closed = _wall(rank, "closed")
    assert ev.via == "section"
    assert ev.step_wall is not None
    assert closed - 0.1 <= ev.step_wall <= closed + 0.01  # the close time, from the block
    assert ev.since_init_s is not None
    assert ev.since_init_s >= 0.5
    rank.wait_output("trained")
    time.sleep(0.2)
    assert _first_steps(events) == 1


def test_fast_steps_with_warmup_still_report_the_first_once(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    # 40 steps of 10 ms: the monitor's 50 ms poll sees a later step open, never the first
    # one closed; the rank's step count (warmup + 2) still proves the first ended.
    start_monitor(make_config(rank_section_timeouts={"step": 30.0, "warmup": 30.0}))
    rank = start_rank(
        [
            ["init", 3],
            ["say_wall", "start"],
            ["steps", 40, 0.01],
            ["say_wall", "end"],
            ["open", "step"],
            ["hang"],
        ]
    )
    ev = events.wait("rank_first_step")
    start, end = _wall(rank, "start"), _wall(rank, "end")
    assert ev.via == "section"
    assert ev.step_wall is not None
    assert start <= ev.step_wall < end  # during training, not when it was over
    time.sleep(0.3)
    assert _first_steps(events) == 1


def test_stopped_rank_is_reported_as_state_t_before_the_monitor_continues_it(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=0.8))
    rank = start_rank([["init"], ["hb"], ["say", "beat"], ["hang"]])
    rank.wait_output("beat")
    os.kill(rank.pid, signal.SIGSTOP)  # as the demo's SimulatedFault hang does
    ev = events.wait("rank_terminated")
    assert ev.cause == "heartbeat_timeout"
    assert ev.proc_state == "T"
    assert rank.wait_exit() == -signal.SIGTERM  # SIGCONT first, then terminated


@pytest.mark.parametrize(("step", "states"), [("hang", {"S"}), ("spin", {"R"})])
def test_waiting_and_busy_ranks_are_told_apart(
    step: str,
    states: set[str],
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=0.8))
    rank = start_rank([["init"], ["hb"], [step]])
    ev = events.wait("rank_terminated")
    assert ev.proc_state in states
    rank.wait_exit()
