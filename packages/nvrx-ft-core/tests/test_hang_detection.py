"""Each timeout kind fires, and only then; real monitor and rank processes, real signals."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(90)]


def test_heartbeats_keep_rank_alive_then_missing_heartbeat_is_detected(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=1.5, initial_rank_heartbeat_timeout=10.0))
    rank = start_rank([["init"], ["beat_for", 3.0, 0.05], ["say", "beats-done"], ["hang"]])
    assert events.wait("rank_connected").pid == rank.pid
    rank.wait_output("beats-done")
    ev = events.wait("rank_terminated")
    assert ev.cause == "heartbeat_timeout"
    assert ev.limit_s == pytest.approx(1.5)
    assert ev.observed_s is not None
    assert ev.observed_s >= 1.5
    assert rank.wait_exit() == -signal.SIGTERM
    assert "Current thread" in rank.output() or "Thread 0x" in rank.output()


def test_missing_first_heartbeat(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(initial_rank_heartbeat_timeout=0.5, rank_heartbeat_timeout=0.5))
    rank = start_rank([["init"], ["hang"]])
    ev = events.wait("rank_terminated")
    assert ev.cause == "initial_heartbeat_timeout"
    assert (ev.rank, ev.pid) == (0, rank.pid)
    rank.wait_exit()


def test_nested_sections_outer_overdue_while_inner_fine(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_section_timeouts={"outer": 1.0, "inner": 30.0}))
    rank = start_rank([["init"], ["open", "outer"], ["open", "inner"], ["hang"]])
    ev = events.wait("rank_terminated")
    assert (ev.cause, ev.section) == ("section_timeout", "outer")
    rank.wait_exit()


def test_sections_within_limits_then_out_of_section_timeout(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_section_timeouts={"step": 2.0}, rank_out_of_section_timeout=2.0))
    steps: list[list[object]] = [["init"]]
    for _ in range(8):
        steps += [["open", "step"], ["sleep", 0.2], ["close", "step"], ["sleep", 0.1]]
    rank = start_rank([*steps, ["say", "steps-done"], ["hang"]])
    rank.wait_output("steps-done")
    ev = events.wait("rank_terminated")
    assert ev.cause == "out_of_section_timeout"
    rank.wait_exit()


def test_sections_only_workload_is_not_killed_for_missing_heartbeats(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(
        make_config(
            initial_rank_heartbeat_timeout=1.5,
            rank_heartbeat_timeout=1.5,
            rank_section_timeouts={"step": 5.0},
        )
    )
    steps: list[list[object]] = [["init"]]
    for _ in range(10):
        steps += [["open", "step"], ["sleep", 0.3], ["close", "step"]]
    rank = start_rank([*steps, ["shutdown"], ["exit", 0]])
    assert rank.wait_exit() == 0
    assert not [e for e in events.drain() if e.event == "rank_terminated"]


def test_heartbeats_only_workload_is_not_killed_for_having_no_section(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=1.5, rank_section_timeouts={"step": 0.3}))
    rank = start_rank([["init"], ["beat_for", 3.0, 0.05], ["shutdown"], ["exit", 0]])
    assert rank.wait_exit() == 0
    assert not [e for e in events.drain() if e.event == "rank_terminated"]


def test_shutdown_stops_checking(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(initial_rank_heartbeat_timeout=1.5))
    rank = start_rank([["init"], ["shutdown"], ["sleep", 3.0], ["exit", 0]])
    assert rank.wait_exit() == 0
    assert not [e for e in events.drain() if e.event == "rank_terminated"]


def test_stopped_rank_is_continued_dumped_and_terminated(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=0.5))
    rank = start_rank([["init"], ["hb"], ["say", "stopping"], ["stop_self"], ["hang"]])
    rank.wait_output("stopping")
    ev = events.wait("rank_terminated")
    assert ev.cause == "heartbeat_timeout"
    assert rank.wait_exit() == -signal.SIGTERM
    out = rank.output()
    assert "most recent call first" in out
    assert "rank_worker.py" in out


def test_rank_ignoring_sigterm_is_killed_after_grace(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    _, log = start_monitor(
        make_config(rank_heartbeat_timeout=0.5, rank_termination_grace_period=1.0)
    )
    rank = start_rank([["init"], ["ignore_sigterm"], ["hb"], ["hang"]])
    events.wait("rank_terminated")
    assert rank.wait_exit() == -signal.SIGKILL
    assert "survived SIGTERM" in log.read_text()


def test_unknown_section_is_not_monitored_and_detection_continues(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    # Changed on purpose (issue 12 item 7): NVRx 0.7 skips an unconfigured section.
    start_monitor(make_config(rank_section_timeouts={"step": 1.0}))
    rank = start_rank(
        [["init"], ["open", "step"], ["try_open", "nope"], ["try_open", "nope"], ["hang"]]
    )
    rank.wait_output("opened nope")
    ev = events.wait("rank_terminated")
    assert (ev.cause, ev.section) == ("section_timeout", "step")
    rank.wait_exit()
    assert rank.output().count("section 'nope' has no configured timeout") == 1


def test_warmup_steps_use_the_warmup_timeout_then_the_step_timeout(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    # Three warmup steps of 1.2 s each would break the 0.5 s step timeout; the fourth does.
    start_monitor(
        make_config(
            rank_section_timeouts={"step": 0.5, "warmup": 5.0},
            rank_out_of_section_timeout=0.3,
        )
    )
    rank = start_rank([["init", 3], ["sleep", 0.6], ["steps", 5, 1.2], ["hang"]])
    ev = events.wait("rank_terminated", timeout=30)
    assert (ev.cause, ev.section) == ("section_timeout", "step")
    assert ev.limit_s == 0.5
    out = rank.output()
    assert "step 4" in out
    assert "step 5" not in out
    rank.wait_exit()


def test_warmup_without_a_warmup_timeout_is_unchecked_from_the_config(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(make_config(rank_section_timeouts={"step": 0.5}, num_warmup_iterations=2))
    rank = start_rank([["init"], ["steps", 2, 1.0], ["say", "warm"], ["open", "step"], ["hang"]])
    ev = events.wait("rank_terminated", timeout=30)
    assert (ev.cause, ev.section) == ("section_timeout", "step")
    assert "warm" in rank.output()
    rank.wait_exit()


def test_install_exception_hook_exits_a_crashed_rank_at_once(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory
) -> None:
    # A live non-daemon thread would hold a normal exit; NVRx's hook uses os._exit(1).
    start_monitor(make_config(install_exception_hook=True))
    rank = start_rank([["init"], ["nondaemon_thread"], ["raise"]])
    assert rank.wait_exit() == 1
    out = rank.output()
    assert "uncaught exception; exiting" in out
    assert "boom from the test" in out
