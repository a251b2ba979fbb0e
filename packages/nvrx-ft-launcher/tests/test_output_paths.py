"""Files the launcher writes are never reached through a symlink another user planted,
and a directory anybody may write to (not sticky) is refused at start-up naming the path.

The machine's ``fs.protected_symlinks`` may be off (it is on many): these tests do not
rely on it; the symlinks belong to uid 65534 (when run as root) in a sticky directory
of that user, where even the kernel's protection would let them be followed.
"""

from __future__ import annotations

import logging
import os
import pathlib
import stat
import tempfile
from collections.abc import Callable, Iterator

import pytest
from launcher_testkit import Launcher  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher._app_logs import cycle_log_paths
from nvrx.launcher._validation import unsafe_output_path
from nvrx.launcher.cli import main
from nvrx.launcher.journal import JsonLines

pytestmark = pytest.mark.timeout(120)
OTHER = 65534
PRECIOUS = "another user's file\n"


@pytest.fixture
def shared() -> Iterator[pathlib.Path]:
    """A sticky, world-writable directory (as /tmp), of uid 65534 when we are root."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-shared-"))
    path.chmod(0o1777)
    if os.getuid() == 0:
        os.chown(path, OTHER, OTHER)
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


def _plant(link: pathlib.Path, target: pathlib.Path) -> None:
    """A symlink at ``link`` to ``target``, owned by the other user when we are root."""
    link.symlink_to(target)
    if os.getuid() == 0:
        os.lchown(link, OTHER, OTHER)


@pytest.fixture
def victim(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "victim.txt"
    path.write_text(PRECIOUS)
    return path


@pytest.mark.parametrize(
    "option", ["--ft-journal", "--ft-cycle-log", "--ft-per-cycle-applog-prefix"]
)
def test_a_file_in_a_world_writable_non_sticky_dir_is_refused(
    option: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    path = open_dir / "job.log"
    with pytest.raises(SystemExit) as info:
        main([option, str(path), "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert f"argument {option}: {str(path)!r}" in err, err
    assert "writable by every user and not sticky" in err
    assert len(err.strip().splitlines()) == 3, err  # one usage error


def test_a_symlinked_journal_is_refused_at_start(
    shared: pathlib.Path, victim: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = shared / "journal.jsonl"
    _plant(link, victim)
    with pytest.raises(SystemExit) as info:
        main(["--ft-journal", str(link), "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert str(link) in err, err
    assert "symlink" in err, err
    assert victim.read_text() == PRECIOUS


def test_safe_places_are_accepted(shared: pathlib.Path, tmp_path: pathlib.Path) -> None:
    group = tmp_path / "project"
    group.mkdir()
    group.chmod(0o2775)  # a project's group-writable log directory
    assert unsafe_output_path(group / "job.log") is None
    assert unsafe_output_path(shared / "job.log") is None  # sticky, as /tmp
    assert unsafe_output_path(tmp_path / "not-yet" / "job.log") is None
    assert unsafe_output_path(shared, is_dir=True) is None
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert unsafe_output_path(open_dir, is_dir=True) is not None


def test_journal_lines_never_follow_a_symlink_planted_after_start(
    shared: pathlib.Path, victim: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = shared / "journal.jsonl"
    journal = JsonLines(path)  # the start-up check passed: nothing there yet
    _plant(path, victim)
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        journal.write({"event": "run_start"})
        journal.write({"event": "finished"})
    assert victim.read_text() == PRECIOUS
    assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1


def test_journal_lines_refuse_a_fifo(shared: pathlib.Path) -> None:
    path = shared / "journal.jsonl"
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        JsonLines(path).write({"event": "run_start"})  # neither blocks nor raises
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to plant another user's symlink")
def test_per_cycle_logs_never_follow_a_planted_symlink(
    start_launcher: Callable[..., Launcher],
    shared: pathlib.Path,
    victim: pathlib.Path,
    tmp_path: pathlib.Path,
) -> None:
    prefix = shared / "job.log"
    # Another user guesses the next cycle's file names and plants links to a victim.
    planted = cycle_log_paths(str(prefix), 1, 0)
    for path in planted:
        _plant(pathlib.Path(path), victim)
    launcher = start_launcher(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--ft-per-cycle-applog-prefix",
         str(prefix)],
        ["--steps", "6", "--fault", "raise:1:3"],
    )  # fmt: skip
    assert launcher.wait(180) == ExitCode.SUCCESS, launcher.log()
    assert victim.read_text() == PRECIOUS
    log = launcher.log()
    for path in planted:
        assert f"per-cycle log {path} is not written" in log, log
        assert pathlib.Path(path).is_symlink()
    # The other files of both cycles are ours, regular, and hold the ranks' output.
    ours = cycle_log_paths(str(prefix), 0, 0)[1]
    assert stat.S_ISREG(os.lstat(ours).st_mode)
    assert os.stat(ours).st_uid == os.getuid()


def test_a_cycle_info_dir_from_yaml_that_anybody_may_write_is_refused(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    open_dir = tmp_path / "cycles"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(f"fault_tolerance:\n  cycle_info_dir: {open_dir}\n")
    with pytest.raises(SystemExit) as info:
        main(["--ft-cfg-path", str(cfg), "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert f"argument --ft-cycle-info-dir: {str(open_dir)!r}" in err, err
    assert "not sticky" in err
