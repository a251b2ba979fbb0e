"""The FT state file round-trips, is written atomically, reads NVRx's shapes, gives each
callback only its own part, and refuses bad content (corrupt, hostile) clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx.ft._state import MAX_STATE_FILE_BYTES
from nvrx.ptl.ft_state import (
    HEARTBEAT_STATE_FILENAME,
    SECTIONS_STATE_FILENAME,
    FtStateError,
    load_ft_state,
    save_ft_state,
)

STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 12.5, "subsequent": 3.25, "were_calculated": True},
    }
}

# What NVRx 0.4.1's FaultToleranceSectionsCallback writes (RankMonitorClient.state_dict()).
NVRX_SECTIONS_STATE = {
    "current_timeouts": {
        "section": {
            "section": {"setup": 61.5, "step": 12.25, "checkpointing": 40.0},
            "out_of_section": 33.0,
            "calculated_sections": ["setup", "step"],
            "is_out_of_section_calculated": True,
        }
    }
}


def test_nvrx_file_names() -> None:
    assert HEARTBEAT_STATE_FILENAME == "_ft_state.json"
    assert SECTIONS_STATE_FILENAME == "_ft_state_.json"


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert load_ft_state(tmp_path / HEARTBEAT_STATE_FILENAME, "heartbeat") is None


def test_round_trip_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    save_ft_state(path, STATE)
    assert load_ft_state(path, "heartbeat") == STATE
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]
    save_ft_state(path, {"current_timeouts": {}})
    assert load_ft_state(path, "heartbeat") is None, "nothing calculated yet"
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    save_ft_state(path, STATE)
    with pytest.raises(TypeError):
        save_ft_state(path, {"current_timeouts": {"bad": object()}})
    with pytest.raises(ValueError, match="not JSON compliant"):
        save_ft_state(path, {"current_timeouts": {"heartbeat": {"initial": float("nan")}}})
    assert load_ft_state(path, "heartbeat") == STATE
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]


def test_each_callback_gets_only_its_own_part(tmp_path: Path) -> None:
    path = tmp_path / SECTIONS_STATE_FILENAME
    both = {
        "current_timeouts": {
            **STATE["current_timeouts"],
            **NVRX_SECTIONS_STATE["current_timeouts"],
        }
    }
    path.write_text(json.dumps(both))
    assert load_ft_state(path, "section") == NVRX_SECTIONS_STATE
    assert load_ft_state(path, "heartbeat") == STATE
    path.write_text(json.dumps(NVRX_SECTIONS_STATE))
    assert load_ft_state(path, "heartbeat") is None


def test_nvrx_0_2_flat_heartbeat_state_comes_back_nested(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    flat = {"current_timeouts": {"initial": 80.0, "subsequent": 20.5, "were_calculated": True}}
    path.write_text(json.dumps(flat))
    assert load_ft_state(path, "heartbeat") == {
        "current_timeouts": {
            "heartbeat": {"initial": 80.0, "subsequent": 20.5, "were_calculated": True}
        }
    }


HB = '{"current_timeouts": {"heartbeat": {"initial": %s, "subsequent": 2.0}}}'
SEC = '{"current_timeouts": {"section": %s}}'


@pytest.mark.parametrize(
    "content",
    [
        json.dumps(STATE)[:25],
        "",
        "[1, 2]",
        '{"current_timeouts": 3}',
        HB % "NaN",
        HB % "Infinity",
        HB % "-Infinity",
        HB % "1e400",
        HB % ("9" * 400),
        HB % ("9" * 5000),
        HB % "0",
        HB % "-1",
        HB % "2592001",
        HB % '"10"',
        HB % "true",
        HB % "[1]",
        HB % "{}",
        '{"current_timeouts": {"heartbeat": "fast"}}',
        '{"current_timeouts": {"heartbeat": {"were_calculated": "yes"}}}',
        SEC % '{"section": ["step"]}',
        SEC % '{"section": {"step": NaN}}',
        SEC % '{"section": {"step": 1e300}}',
        SEC % '{"out_of_section": "300"}',
        SEC % '{"calculated_sections": "step"}',
        SEC % '{"is_out_of_section_calculated": 1}',
        "[" * 100_000 + "]" * 100_000,
        HB % ("[" * 500 + "]" * 500),
    ],
)
def test_bad_content_is_a_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_text(content)
    with pytest.raises(FtStateError) as info:
        load_ft_state(path, "heartbeat")
    assert str(path) in str(info.value)
    with pytest.raises(FtStateError):
        load_ft_state(path, "section")  # a bad file is bad for either callback


def test_binary_garbage_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FtStateError, match="not valid JSON"):
        load_ft_state(path, "heartbeat")


def test_huge_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_text(" " * (MAX_STATE_FILE_BYTES + 1))
    with pytest.raises(FtStateError, match="larger than"):
        load_ft_state(path, "heartbeat")


def test_a_directory_in_place_of_the_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.mkdir()
    with pytest.raises(FtStateError, match="not a regular file"):
        load_ft_state(path, "heartbeat")
