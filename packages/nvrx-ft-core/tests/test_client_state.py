"""Calculated timeouts: state_dict round trip, loading before and after init, 2 gloo ranks."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import socket
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.conftest import Events, MakeConfig, MonitorFactory, RankFactory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]


def _state(output: str) -> dict[str, Any]:
    lines = [ln for ln in output.splitlines() if ln.startswith("STATE ")]
    assert lines, output
    state: dict[str, Any] = json.loads(lines[-1].removeprefix("STATE "))
    return state


def test_state_dict_round_trip_and_loaded_timeouts_are_enforced(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
) -> None:
    start_monitor(
        make_config(
            initial_rank_heartbeat_timeout=60.0,
            rank_heartbeat_timeout=60.0,
            rank_section_timeouts={"step": 60.0},
            rank_out_of_section_timeout=60.0,
            safety_factor=20.0,  # calculated timeouts stay seconds long: robust under load
        )
    )
    steps: list[list[object]] = [["init"], ["print_state"], ["sleep", 0.2]]
    for _ in range(3):
        steps += [["hb"], ["open", "step"], ["sleep", 0.1], ["close", "step"], ["sleep", 0.1]]
    steps += [["calc_hb"], ["calc_sections"], ["print_state"], ["exit", 0]]
    first = start_rank(steps)
    assert first.wait_exit() == 0, first.output()
    out = first.output()
    first_state = next(ln for ln in out.splitlines() if ln.startswith("STATE "))
    assert json.loads(first_state.removeprefix("STATE ")) == {"current_timeouts": {}}
    state = _state(out)
    current = state["current_timeouts"]
    hb, sec = current["heartbeat"], current["section"]
    assert hb["were_calculated"] is True
    assert 20 * 0.2 <= hb["subsequent"] < 60.0
    assert hb["initial"] >= 20 * 0.2
    assert sec["calculated_sections"] == ["step"]
    assert sec["section"]["step"] >= 20 * 0.1
    assert sec["out_of_section"] >= 20 * 0.1
    assert json.loads(json.dumps(state)) == state

    # Loaded before init: the monitor enforces the loaded (short) heartbeat timeout, not 60 s.
    tight = {
        "current_timeouts": {
            "heartbeat": {"initial": 60.0, "subsequent": 2.5, "were_calculated": True}
        }
    }
    second = start_rank(
        [["load_state", json.dumps(tight)], ["init"], ["print_state"], ["hb"], ["hang"]]
    )
    ev = events.wait("rank_terminated")
    assert (ev.pid, ev.cause, ev.limit_s) == (second.pid, "heartbeat_timeout", 2.5)
    second.wait_exit()
    assert _state(second.output()) == tight

    # Loaded after init: same effect, and the round trip is exact.
    third = start_rank([["init"], ["load_state", json.dumps(state)], ["print_state"], ["exit", 0]])
    assert third.wait_exit() == 0, third.output()
    assert _state(third.output()) == state


@pytest.mark.parametrize(
    "bad",
    [
        {"current_timeouts": {"heartbeat": {"bogus": 1}}},
        {"current_timeouts": {"heartbeat": {"initial": -1, "subsequent": 1}}},
        {"current_timeouts": {"heartbeat": {"initial": float("nan"), "subsequent": 1}}},
        {"current_timeouts": {"heartbeat": {"initial": float("inf"), "subsequent": 1}}},
        {"current_timeouts": {"heartbeat": {"initial": 1e300, "subsequent": 1}}},
        {"current_timeouts": {"heartbeat": {"initial": "60", "subsequent": 1}}},
        {"current_timeouts": {"section": {"section": "step:60"}}},
        {"current_timeouts": {"section": {"section": {"step": 1}, "calculated_sections": 3}}},
        {"current_timeouts": 3},
        {"current_timeouts": {"heartbeat": {"initial": [[[[[[[[[[1]]]]]]]]]]}}},
        [1, 2],
        "state",
    ],
)
def test_load_state_dict_never_raises_and_keeps_config(
    bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    # Changed on purpose (issue 13 item 3): unusable state is logged, never raised.
    from nvrx.ft import RankMonitorClient

    client = RankMonitorClient()
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.RankMonitorClient"):
        client.load_state_dict(bad)  # type: ignore[arg-type]
    assert client.loaded_hb_timeouts is None
    assert client.loaded_section_timeouts is None
    assert "ignoring saved FT state" in caplog.text


@pytest.mark.parametrize("empty", [{}, {"current_timeouts": {}}])
def test_load_state_dict_of_nothing_calculated_is_a_no_op(empty: dict[str, Any]) -> None:
    from nvrx.ft import RankMonitorClient

    client = RankMonitorClient()
    client.load_state_dict(empty)
    assert client.loaded_hb_timeouts is None


def test_nvrx_state_shapes_are_read() -> None:
    from nvrx.ft import RankMonitorClient
    from nvrx.ft.data import HeartbeatTimeouts

    client = RankMonitorClient()
    # NVRx before 0.4: heartbeat timeouts straight under current_timeouts.
    client.load_state_dict(
        {"current_timeouts": {"initial": 120.0, "subsequent": 45.5, "were_calculated": True}}
    )
    assert client.loaded_hb_timeouts == HeartbeatTimeouts(120.0, 45.5, True)
    # NVRx 0.4+ / Megatron's ft_state.json.
    client.load_state_dict(
        {
            "current_timeouts": {
                "section": {
                    "section": {"setup": 600.0, "step": 31.0, "checkpointing": None},
                    "out_of_section": 99.0,
                    "calculated_sections": ["step"],
                    "is_out_of_section_calculated": True,
                }
            }
        }
    )
    sec = client.loaded_section_timeouts
    assert sec is not None
    assert sec.section["step"] == 31.0
    assert sec.calculated_sections == {"step"}


def test_state_file_reader_validates(tmp_path: pathlib.Path) -> None:
    from nvrx.ft import FtStateError, read_timeouts_state_file

    good = tmp_path / "ft_state.json"
    good.write_text(
        '{"current_timeouts": {"heartbeat": {"initial": 9, "subsequent": 3,'
        ' "were_calculated": true}}}'
    )
    loaded = read_timeouts_state_file(good)
    assert loaded.heartbeat is not None
    assert loaded.heartbeat.subsequent == 3.0
    for text, why in [
        ('{"current_timeouts": {"heartbeat": {"initial": NaN}}}', "NaN"),
        ('{"current_timeouts": {"heartbeat": {"initial": Infinity}}}', "Infinity"),
        ('{"current_timeouts": {"heartbeat": {"initial": 1' + "0" * 5000 + "}}}", "JSON|too large"),
        ("[" * 100_000 + "]" * 100_000, "JSON"),
        ('{"current_timeouts": {"heartbeat"', "JSON"),
        ('{"current_timeouts": ["x"]}', "not a mapping"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(FtStateError, match=why) as info:
            read_timeouts_state_file(bad)
        assert str(bad) in str(info.value)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(FtStateError, match="not a regular file"):
        read_timeouts_state_file(fifo)
    with pytest.raises(FileNotFoundError):
        read_timeouts_state_file(tmp_path / "missing.json")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_calculated_timeouts_agree_across_two_gloo_ranks(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = make_config(rank_section_timeouts={"step": 60.0, "ckpt": 60.0}, safety_factor=10.0)
    start_monitor(cfg, local_rank=0)
    start_monitor(cfg, local_rank=1)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("WORLD_SIZE", "2")
    ranks = []
    for r in range(2):
        nap = 0.05 if r == 0 else 0.3  # rank 1 has the longest intervals
        steps: list[list[object]] = [["dist_init"], ["init"], ["dist_barrier"]]
        for _ in range(3):
            steps += [["hb"], ["open", "step"], ["sleep", nap], ["close", "step"]]
        if r == 0:  # only rank 0 checkpoints: rank 1 adopts its maximum
            steps += [["open", "ckpt"], ["sleep", 0.2], ["close", "ckpt"]]
        steps += [["calc_hb"], ["calc_sections"], ["print_state"], ["exit", 0]]
        ranks.append(start_rank(steps, local_rank=r, rank=r))
    for rank in ranks:
        assert rank.wait_exit(timeout=90) == 0, rank.output()
    s0, s1 = (_state(rank.output()) for rank in ranks)
    assert s0 == s1
    sec = s0["current_timeouts"]["section"]
    assert sec["section"]["step"] >= 10 * 0.3
    assert sec["section"]["ckpt"] >= 10 * 0.2
    assert s0["current_timeouts"]["heartbeat"]["subsequent"] >= 10 * 0.3


def test_section_order_does_not_matter_in_the_reduce(tmp_path: Any) -> None:
    script = tmp_path / "sync.py"
    script.write_text(
        "import os, sys, json\n"
        "import torch.distributed as dist\n"
        "from nvrx.ft import TimeoutsCalc, SectionAction\n"
        "dist.init_process_group('gloo')\n"
        "r = dist.get_rank()\n"
        "names = ['a', 'b', 'c'] if r == 0 else ['c', 'b', 'a']\n"
        "calc = TimeoutsCalc(sections=names, start_time=0.0)\n"
        "calc.update_on_section_event('a', SectionAction.OPEN, 1.0)\n"
        "calc.update_on_section_event('a', SectionAction.CLOSE, 1.0 + (5 if r == 0 else 1))\n"
        "calc.update_on_section_event('c', SectionAction.OPEN, 10.0)\n"
        "calc.update_on_section_event('c', SectionAction.CLOSE, 10.0 + (1 if r == 0 else 7))\n"
        "calc.synchronize_all()\n"
        "print(json.dumps(calc.section_to_max_time, sort_keys=True))\n"
        "dist.destroy_process_group()\n"
    )
    import subprocess

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0]
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert results[0] == results[1] == {"a": 5.0, "b": -1.0, "c": 7.0}


def test_loaded_state_only_overrides_calculated_timeouts(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
) -> None:
    start_monitor(
        make_config(
            rank_section_timeouts={"step": 30.0, "ckpt": 900.0, "gone": None},
            rank_out_of_section_timeout=50.0,
        )
    )
    # An earlier run calculated "step" (and a section no longer configured) only.
    state = {
        "current_timeouts": {
            "section": {
                "section": {"step": 12.0, "ckpt": 600.0, "old": 5.0},
                "out_of_section": 70.0,
                "calculated_sections": ["old", "step"],
                "is_out_of_section_calculated": False,
            }
        }
    }
    rank = start_rank([["load_state", json.dumps(state)], ["init"], ["print_state"], ["exit", 0]])
    assert rank.wait_exit() == 0, rank.output()
    sec = _state(rank.output())["current_timeouts"]["section"]
    assert sec["section"] == {"step": 12.0, "ckpt": 900.0, "gone": None}
    assert sec["out_of_section"] == 50.0
    assert sec["calculated_sections"] == ["step"]
    assert "unconfigured sections ['old']" in rank.output()


@pytest.mark.slow
def test_stopped_rank_hangs_its_peer_in_all_reduce_and_both_are_terminated(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = make_config(initial_rank_heartbeat_timeout=60.0, rank_heartbeat_timeout=2.0)
    start_monitor(cfg, local_rank=0)
    start_monitor(cfg, local_rank=1)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("WORLD_SIZE", "2")
    healthy = start_rank([["dist_init"], ["init"], ["train", 100000, 0.02]], rank=0)
    stopped = start_rank(
        [
            ["dist_init"],
            ["init"],
            ["train", 20, 0.02],
            ["say", "stopping"],
            ["stop_self"],
            ["hang"],
        ],
        local_rank=1,
        rank=1,
    )
    stopped.wait_output("stopping", timeout=90)
    terminated = {events.wait("rank_terminated").pid for _ in range(2)}
    assert terminated == {healthy.pid, stopped.pid}
    healthy.wait_exit()
    stopped.wait_exit()
    assert "all_reduce" in healthy.output()  # its stack dump shows where it hung
    assert "most recent call first" in stopped.output()


def test_loaded_timeouts_are_raised_to_the_floor(
    make_config: MakeConfig,
    start_monitor: MonitorFactory,
    start_rank: RankFactory,
) -> None:
    start_monitor(make_config(rank_section_timeouts={"step": 30.0}, min_calculated_timeout=20.0))
    state = {
        "current_timeouts": {
            "heartbeat": {"initial": 0.7, "subsequent": 45.0, "were_calculated": True},
            "section": {
                "section": {"step": 0.2},
                "out_of_section": 1.0,
                "calculated_sections": ["step"],
                "is_out_of_section_calculated": True,
            },
        }
    }
    rank = start_rank([["load_state", json.dumps(state)], ["init"], ["print_state"], ["exit", 0]])
    assert rank.wait_exit() == 0, rank.output()
    current = _state(rank.output())["current_timeouts"]
    assert (current["heartbeat"]["initial"], current["heartbeat"]["subsequent"]) == (20.0, 45.0)
    assert current["section"]["section"] == {"step": 20.0}
    assert current["section"]["out_of_section"] == 20.0
