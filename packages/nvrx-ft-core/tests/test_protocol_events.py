"""Wire formats: control frames and launcher events are validated, never trusted."""

from __future__ import annotations

import json
import pathlib
import struct

import pytest

from nvrx.ft import MonitorEvent, parse_monitor_event
from nvrx.ft._protocol import (
    MAX_MESSAGE_BYTES,
    FrameReader,
    ProtocolError,
    encode_frame,
    validate_request,
)
from nvrx.ft._runtime import check_private_dir


def test_frames_survive_arbitrary_splits() -> None:
    stream = encode_frame({"type": "shutdown"}) + encode_frame({"type": "x", "n": 1})
    reader = FrameReader()
    got: list[bytes] = []
    for i in range(len(stream)):
        got += reader.feed(stream[i : i + 1])
    assert [json.loads(p) for p in got] == [{"type": "shutdown"}, {"type": "x", "n": 1}]
    assert reader.pending == 0


def test_oversized_frame_is_rejected_from_its_header() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameReader().feed(struct.pack(">I", MAX_MESSAGE_BYTES + 1))
    with pytest.raises(ProtocolError, match="exceeds"):
        encode_frame({"type": "x", "blob": "a" * MAX_MESSAGE_BYTES})


@pytest.mark.parametrize(
    "message",
    [
        {"type": "init", "v": 2, "rank": 0, "local_rank": 0, "host": "h", "stack_dump": True},
        {"type": "init", "v": 1, "rank": True, "local_rank": 0, "host": "h", "stack_dump": True},
        {
            "type": "init",
            "v": 1,
            "rank": 0,
            "local_rank": 0,
            "host": "h",
            "stack_dump": True,
            "extra": 1,
        },
        {"type": "set_timeouts"},
        {"type": "set_timeouts", "heartbeat": {"initial": "1", "subsequent": None}},
        {"type": "set_timeouts", "section": {"section": {"a": 0}, "out_of_section": None}},
        {"type": "set_timeouts", "section": {"section": [], "out_of_section": None}},
        {"type": "workload_control", "action": 1, "description": "d"},
        {"type": "shutdown", "now": True},
        {"type": None},
    ],
)
def test_bad_requests_are_rejected(message: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        validate_request(message)


def test_good_requests_pass() -> None:
    ok: list[dict[str, object]] = [
        {"type": "init", "v": 1, "rank": 3, "local_rank": 1, "host": "h", "stack_dump": False},
        {
            "type": "set_timeouts",
            "heartbeat": {"initial": None, "subsequent": 2.5},
            "section": None,
        },
        {
            "type": "set_timeouts",
            "heartbeat": None,
            "section": {"section": {"a": 1, "b": None}, "out_of_section": 3},
        },
        {"type": "workload_control", "action": "ShutdownWorkload", "description": ""},
        {"type": "shutdown"},
    ]
    for message in ok:
        assert validate_request(message) is message


def test_event_round_trip() -> None:
    ev = MonitorEvent(
        event="rank_terminated",
        local_rank=1,
        rank=9,
        pid=1234,
        cause="section_timeout",
        section="step",
        observed_s=2.5,
        limit_s=2,
        message="m",
    )
    assert parse_monitor_event(ev.to_bytes()) == MonitorEvent(
        event="rank_terminated",
        local_rank=1,
        rank=9,
        pid=1234,
        cause="section_timeout",
        section="step",
        observed_s=2.5,
        limit_s=2.0,
        message="m",
    )


def test_first_step_and_process_state_round_trip() -> None:
    first = MonitorEvent(
        event="rank_first_step",
        local_rank=1,
        rank=9,
        pid=1234,
        step_wall=1_764_590_000,
        since_init_s=0,
        via="section",
    )
    back = parse_monitor_event(first.to_bytes())
    assert back == first
    assert isinstance(back.step_wall, float)
    assert isinstance(back.since_init_s, float)
    for state in "RSDTtZ":
        hung = MonitorEvent(
            event="rank_terminated",
            local_rank=0,
            rank=0,
            pid=1,
            cause="heartbeat_timeout",
            message="m",
            proc_state=state,
        )
        assert parse_monitor_event(hung.to_bytes()).proc_state == state


@pytest.mark.parametrize(
    "body",
    [
        b"nope",
        b"[]",
        b'{"v": 2, "event": "rank_connected", "local_rank": 0, "rank": 0, "pid": 1}',
        b'{"v": 1, "event": "hello", "local_rank": 0, "rank": 0, "pid": 1}',
        b'{"v": 1, "event": "rank_connected", "local_rank": "0", "rank": 0, "pid": 1}',
        b'{"v": 1, "event": "rank_connected", "local_rank": 0, "rank": 0, "pid": 1, "x": 1}',
        b'{"v": 1, "event": "rank_terminated", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "cause": "boredom", "message": "m"}',
        b'{"v": 1, "event": "workload_control", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "action": "Reboot", "description": "d"}',
        b"x" * 20000,
        *(
            b'{"v": 1, "event": "rank_first_step", "local_rank": 0, "rank": 0, "pid": 1, ' + tail
            for tail in [
                b'"step_wall": 1.0, "since_init_s": 0.5}',
                b'"step_wall": 1.0, "since_init_s": 0.5, "via": "magic"}',
                b'"step_wall": true, "since_init_s": 0.5, "via": "heartbeat"}',
                b'"step_wall": -1.0, "since_init_s": 0.5, "via": "heartbeat"}',
                b'"step_wall": 1e300, "since_init_s": 0.5, "via": "heartbeat"}',
                b'"step_wall": 1.0, "since_init_s": -0.5, "via": "section"}',
                b'"step_wall": 1.0, "via": "section"}',
                b'"step_wall": 1.0, "since_init_s": 0.5, "via": "section", "cause": "x"}',
            ]
        ),
        b'{"v": 1, "event": "rank_terminated", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "cause": "heartbeat_timeout", "message": "m", "proc_state": "Q"}',
        b'{"v": 1, "event": "rank_terminated", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "cause": "heartbeat_timeout", "message": "m", "proc_state": "TT"}',
        b'{"v": 1, "event": "rank_connected", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "proc_state": "T"}',
        # unhashable values where a name is expected: a ValueError, never a TypeError
        b'{"v": 1, "event": ["rank_connected"], "local_rank": 0, "rank": 0, "pid": 1}',
        b'{"v": 1, "event": "rank_terminated", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "cause": "heartbeat_timeout", "message": "m", "proc_state": ["T"]}',
        b'{"v": 1, "event": "rank_terminated", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "cause": {"a": 1}, "message": "m"}',
        b'{"v": 1, "event": "rank_first_step", "local_rank": 0, "rank": 0, "pid": 1,'
        b' "step_wall": 1.0, "since_init_s": 0.5, "via": ["section"]}',
    ],
)
def test_bad_events_are_rejected(body: bytes) -> None:
    with pytest.raises(ValueError, match="bad monitor event"):
        parse_monitor_event(body)


def test_private_dir_check(tmp_path: pathlib.Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    check_private_dir(d)
    d.chmod(0o750)
    with pytest.raises(PermissionError, match="750"):
        check_private_dir(d)
