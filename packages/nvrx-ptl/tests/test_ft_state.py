"""The FT state file round-trips, is written atomically and rejects bad content clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx.ptl.ft_state import FT_STATE_FILENAME, FtStateError, load_ft_state, save_ft_state

STATE = {
    "current_timeouts": {
        "heartbeat": {"initial": 12.5, "subsequent": 3.25, "were_calculated": True},
    }
}


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert load_ft_state(tmp_path / FT_STATE_FILENAME) is None


def test_round_trip_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / FT_STATE_FILENAME
    save_ft_state(path, STATE)
    assert load_ft_state(path) == STATE
    assert [p.name for p in tmp_path.iterdir()] == [FT_STATE_FILENAME]
    save_ft_state(path, {"current_timeouts": {}})
    assert load_ft_state(path) == {"current_timeouts": {}}
    assert [p.name for p in tmp_path.iterdir()] == [FT_STATE_FILENAME]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / FT_STATE_FILENAME
    save_ft_state(path, STATE)
    with pytest.raises(TypeError):
        save_ft_state(path, {"current_timeouts": {"bad": object()}})
    assert load_ft_state(path) == STATE
    assert [p.name for p in tmp_path.iterdir()] == [FT_STATE_FILENAME]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (json.dumps(STATE)[:25], "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "not an FT state"),
        ('{"current_timeouts": 3}', "not an FT state"),
        ('{"other": {}}', "not an FT state"),
    ],
)
def test_bad_content_is_a_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / FT_STATE_FILENAME
    path.write_text(content)
    with pytest.raises(FtStateError, match=message) as info:
        load_ft_state(path)
    assert str(path) in str(info.value)


def test_binary_garbage_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / FT_STATE_FILENAME
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FtStateError, match=str(path)):
        load_ft_state(path)
