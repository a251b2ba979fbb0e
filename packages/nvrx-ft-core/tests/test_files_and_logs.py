"""The atomic file write every state/config writer uses, and the shared log line format."""

from __future__ import annotations

import logging
import pathlib
import re
import stat

import pytest

from nvrx.ft import log_formatter, write_file_atomically

pytestmark = pytest.mark.timeout(30)


def test_write_replaces_the_file_whole(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    write_file_atomically(target, '{"new": 1}\n')
    assert target.read_text() == '{"new": 1}\n'
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):
        write_file_atomically(target, "half \udc80 written")  # not encodable as UTF-8
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_mode_is_applied(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "secret"
    write_file_atomically(target, "x", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_the_log_line_format_names_who_when_and_level() -> None:
    record = logging.LogRecord(
        "nvrx.test", logging.WARNING, __file__, 1, "hello %s", ("you",), None
    )
    record.local_rank = 3
    line = log_formatter("RankMonitor %(process)d local_rank %(local_rank)s").format(record)
    assert re.fullmatch(
        r"\[RankMonitor \d+ local_rank 3\] \d\d:\d\d:\d\d\.\d{3} WARNING: hello you", line
    ), line
