"""Learned timeouts: the pure rules, then a real monitor and rank."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from nvrx.ft._learning import (
    CHECKPOINT,
    VALIDATION,
    LearnSettings,
    automatic_floor,
    cap_and_floor,
    learned_timeout,
    pending_reason,
)

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

pytestmark = pytest.mark.timeout(120)


def test_the_automatic_floor_is_20_check_intervals_and_at_least_2_s() -> None:
    assert automatic_floor(0.1) == 2.0
    assert automatic_floor(0.01) == 2.0
    assert automatic_floor(0.5) == 10.0
    assert automatic_floor(5.0) == 100.0


def test_a_learned_timeout_is_sf_times_the_longest_floored_and_capped() -> None:
    assert learned_timeout(1.0, 300.0, 5.0, 2.0) == 5.0
    assert learned_timeout(0.1, 300.0, 5.0, 2.0) == 2.0  # floor
    assert learned_timeout(100.0, 300.0, 5.0, 2.0) == 300.0  # never above configured
    assert learned_timeout(0.1, 1.0, 5.0, 2.0) == 1.0  # configured below the floor wins
    assert learned_timeout(1.0, None, 5.0, 2.0) is None  # a check that is off stays off
    assert learned_timeout(None, 300.0, 5.0, 2.0) == 300.0  # nothing seen: configured
    assert learned_timeout(-1.0, 300.0, 5.0, 2.0) == 300.0
    assert cap_and_floor(0.5, None, 2.0) == 2.0


def test_learned_timeouts_only_loosen_as_longer_intervals_are_seen() -> None:
    longest = [0.2, 0.2, 1.0, 0.5, 2.0, 1.5]
    values: list[float] = []
    seen = 0.0
    for interval in longest:
        seen = max(seen, interval)
        value = learned_timeout(seen, 300.0, 5.0, 2.0)
        assert value is not None
        values.append(value)
    assert values == sorted(values)
    assert values[-1] == 10.0


def test_learning_waits_for_warmup_steps_and_the_expected_events() -> None:
    settings = LearnSettings(
        safety_factor=5.0,
        floor=2.0,
        warmup_steps=3,
        min_steps=10,
        expected=frozenset({CHECKPOINT, VALIDATION}),
    )
    assert settings.steps_needed == 13
    assert pending_reason(12, {CHECKPOINT, VALIDATION}, settings) == "12 of 13 steps seen"
    reason = pending_reason(13, {CHECKPOINT}, settings)
    assert reason is not None
    assert "validation" in reason
    assert pending_reason(13, {CHECKPOINT, VALIDATION, "epoch"}, settings) is None
    plain = LearnSettings(safety_factor=5.0, floor=2.0, warmup_steps=0, min_steps=4)
    assert pending_reason(4, set(), plain) is None


def _learned_line(output: str) -> str:
    return next(ln for ln in output.splitlines() if ln.startswith("learned "))


def test_a_learned_timeout_detects_a_hang_on_the_first_run(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    """Configured 300 s (NeMo's), 0.1 s steps and a 0.5 s save: the hang is caught after
    5 x the longest interval (the save's, about 0.6 s), not after 300 s."""
    start_monitor(
        make_config(
            initial_rank_heartbeat_timeout=300.0, rank_heartbeat_timeout=300.0, learn_min_steps=5
        )
    )
    rank = start_rank(
        [
            ["init"],
            ["learn", "checkpoint"],
            ["beats", 6, 0.1],
            ["say_learned"],  # not yet: no checkpoint seen
            ["note", "checkpoint"],
            ["sleep", 0.5],  # the save
            ["beats", 2, 0.1],
            ["say_learned"],
            ["hang"],
        ]
    )
    ev = events.wait("rank_terminated")
    assert (ev.pid, ev.cause) == (rank.pid, "heartbeat_timeout")
    assert ev.limit_s is not None
    assert 5 * 0.6 <= ev.limit_s < 60.0
    rank.wait_exit()
    lines = [ln for ln in rank.output().splitlines() if ln.startswith("learned ")]
    assert lines[0].startswith("learned False")
    assert lines[1].startswith("learned True")


def test_learning_loosens_and_an_unseen_event_runs_under_the_configured_timeout(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory
) -> None:
    """Learned 2 s from 0.1 s steps; a 2.5 s first epoch boundary is not killed, and a
    later 1 s interval loosens the timeout to 5 s, written to the state."""
    start_monitor(
        make_config(
            initial_rank_heartbeat_timeout=60.0, rank_heartbeat_timeout=60.0, learn_min_steps=3
        )
    )
    rank = start_rank(
        [
            ["init"],
            ["learn"],
            ["beats", 5, 0.1],
            ["say_learned"],
            ["note", "epoch"],
            ["sleep", 2.5],
            ["beats", 2, 0.1],
            ["print_state"],
            ["exit", 0],
        ]
    )
    assert rank.wait_exit() == 0, rank.output()
    assert _learned_line(rank.output()).startswith("learned True")
    state_line = next(ln for ln in rank.output().splitlines() if ln.startswith("STATE "))
    state = json.loads(state_line.removeprefix("STATE "))
    subsequent = state["current_timeouts"]["heartbeat"]["subsequent"]
    assert 5 * 2.5 <= subsequent <= 60.0


def test_learn_timeouts_false_keeps_nvrx_behaviour(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory
) -> None:
    start_monitor(make_config(rank_heartbeat_timeout=60.0, learn_timeouts=False, learn_min_steps=1))
    rank = start_rank(
        [["init"], ["learn"], ["beats", 4, 0.05], ["say_learned"], ["print_state"], ["exit", 0]]
    )
    assert rank.wait_exit() == 0, rank.output()
    assert _learned_line(rank.output()).startswith("learned False")
    assert 'STATE {"current_timeouts": {}}' in rank.output()


def test_learned_section_timeouts_are_capped_at_the_configured_ones(
    make_config: MakeConfig, start_monitor: MonitorFactory, start_rank: RankFactory, events: Events
) -> None:
    start_monitor(
        make_config(
            rank_section_timeouts={"step": 2.5, "checkpointing": 100.0},
            rank_out_of_section_timeout=100.0,
            learn_timeouts=True,
            learn_min_steps=3,
        )
    )
    rank = start_rank([["init"], ["steps", 4, 0.6], ["print_state"], ["open", "step"], ["hang"]])
    ev = events.wait("rank_terminated")
    assert (ev.pid, ev.cause, ev.section) == (rank.pid, "section_timeout", "step")
    assert ev.limit_s == 2.5  # 5 x 0.6 s = 3 s is above the configured 2.5 s
    rank.wait_exit()
    state_line = next(ln for ln in rank.output().splitlines() if ln.startswith("STATE "))
    section = json.loads(state_line.removeprefix("STATE "))["current_timeouts"]["section"]
    assert section["section"]["step"] == 2.5
    assert section["section"]["checkpointing"] == 100.0  # never seen: configured
    assert section["out_of_section"] == 2.0  # the floor
