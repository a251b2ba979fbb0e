"""The FT state file round-trips, is written atomically, reads NVRx's shapes and refuses bad
content (corrupt, hostile) clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx.ptl.ft_state import (
    HEARTBEAT_STATE_FILENAME,
    MAX_STATE_FILE_BYTES,
    SECTIONS_STATE_FILENAME,
    FtStateError,
    load_ft_state,
    parse_ft_state,
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
    assert load_ft_state(tmp_path / HEARTBEAT_STATE_FILENAME) is None


def test_round_trip_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    save_ft_state(path, STATE)
    assert load_ft_state(path) == STATE
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]
    save_ft_state(path, {"current_timeouts": {}})
    assert load_ft_state(path) == {"current_timeouts": {}}
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    save_ft_state(path, STATE)
    with pytest.raises(TypeError):
        save_ft_state(path, {"current_timeouts": {"bad": object()}})
    with pytest.raises(ValueError, match="not JSON compliant"):
        save_ft_state(path, {"current_timeouts": {"heartbeat": {"initial": float("nan")}}})
    assert load_ft_state(path) == STATE
    assert [p.name for p in tmp_path.iterdir()] == [HEARTBEAT_STATE_FILENAME]


def test_nvrx_sections_state_is_read_as_written() -> None:
    assert parse_ft_state(json.dumps(NVRX_SECTIONS_STATE)) == NVRX_SECTIONS_STATE


def test_nvrx_0_2_flat_heartbeat_state_comes_back_nested() -> None:
    flat = {"current_timeouts": {"initial": 80.0, "subsequent": 20.5, "were_calculated": True}}
    assert parse_ft_state(json.dumps(flat)) == {
        "current_timeouts": {
            "heartbeat": {"initial": 80.0, "subsequent": 20.5, "were_calculated": True}
        }
    }


def test_unknown_keys_are_dropped() -> None:
    text = json.dumps(
        {
            "current_timeouts": {
                "heartbeat": {"initial": 1.0, "subsequent": 2.0, "extra": [1]},
                "future": {},
            },
            "other": 1,
        }
    )
    assert parse_ft_state(text) == {
        "current_timeouts": {
            "heartbeat": {"initial": 1.0, "subsequent": 2.0, "were_calculated": None}
        }
    }


HB = '{"current_timeouts": {"heartbeat": {"initial": %s, "subsequent": 2.0}}}'
SEC = '{"current_timeouts": {"section": %s}}'


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps(STATE)[:25], "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"current_timeouts": 3}', "expected a JSON object"),
        ('{"other": {}}', "expected a JSON object"),
        (HB % "NaN", "NaN is not a timeout"),
        (HB % "Infinity", "Infinity is not a timeout"),
        (HB % "-Infinity", "-Infinity is not a timeout"),
        (HB % "1e400", "must be finite"),
        (HB % ("9" * 400), "must be finite"),
        (HB % ("9" * 5000), "not valid JSON"),
        (HB % "0", "must be finite, > 0"),
        (HB % "-1", "must be finite, > 0"),
        (HB % "2592001", "at most 2592000 s"),
        (HB % '"10"', "heartbeat.initial must be a number"),
        (HB % "true", "heartbeat.initial must be a number"),
        (HB % "[1]", "heartbeat.initial must be a number"),
        (HB % "{}", "heartbeat.initial must be a number"),
        ('{"current_timeouts": {"heartbeat": "fast"}}', "heartbeat must be a JSON object"),
        ('{"current_timeouts": {"heartbeat": {"were_calculated": "yes"}}}', "true or false"),
        (SEC % '{"section": ["step"]}', "section.section must be a JSON object"),
        (SEC % '{"section": {"step": NaN}}', "NaN"),
        (SEC % '{"section": {"step": 1e300}}', "at most"),
        (SEC % '{"out_of_section": "300"}', "section.out_of_section must be a number"),
        (SEC % '{"calculated_sections": "step"}', "calculated_sections must be a list"),
        (SEC % '{"is_out_of_section_calculated": 1}', "true or false"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        (HB % ("[" * 500 + "]" * 500), "heartbeat.initial must be a number"),
    ],
)
def test_bad_content_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_text(content)
    with pytest.raises(FtStateError, match=message.replace("[", r"\[")) as info:
        load_ft_state(path)
    assert str(path) in str(info.value)


def test_binary_garbage_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FtStateError, match="not UTF-8"):
        load_ft_state(path)


def test_huge_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.write_text(" " * (MAX_STATE_FILE_BYTES + 1))
    with pytest.raises(FtStateError, match="larger than"):
        load_ft_state(path)


def test_a_directory_in_place_of_the_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / HEARTBEAT_STATE_FILENAME
    path.mkdir()
    with pytest.raises(FtStateError, match="cannot read"):
        load_ft_state(path)
