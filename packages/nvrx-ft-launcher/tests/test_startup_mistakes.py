"""Mistakes stop the job before anything runs: a real ft_launcher, exit 2, one error line."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from nvrx.launcher import ExitCode

pytestmark = [pytest.mark.multiprocess]


def _launch(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    return subprocess.run(
        [sys.executable, "-m", "nvrx.launcher", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ft_launcher: error:")]


@pytest.mark.timeout(120)
def test_missing_training_script_is_exit_2_naming_the_path(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "events.jsonl"
    done = _launch(
        ["--nproc-per-node", "1", "--max-restarts", "3", f"--ft-journal={journal}", "nope.py"],
        tmp_path,
    )
    assert done.returncode == ExitCode.USAGE_ERROR, done.stderr
    (line,) = _error_lines(done.stderr)
    assert "'nope.py': no such file" in line
    assert str(tmp_path) in line  # where it looked
    assert "Traceback" not in done.stderr
    assert "RankMonitor" not in done.stderr  # no monitor started, none wraps the error
    assert not journal.exists()  # no cycle, no restart, no ETTR for a job that never ran


@pytest.mark.timeout(120)
@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_training_script_is_exit_2(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never')\n")
    script.chmod(0)
    done = _launch(["--nproc-per-node", "1", str(script)], tmp_path)
    assert done.returncode == ExitCode.USAGE_ERROR, done.stderr
    assert "not readable" in _error_lines(done.stderr)[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "argv",
    [
        ["--no-python", sys.executable, "-c", "print('ran as a program')"],
        ["-m", "json.tool", "--help"],
    ],
)
def test_a_program_or_module_is_not_a_path(tmp_path: pathlib.Path, argv: list[str]) -> None:
    done = _launch(["--standalone", "--nproc-per-node", "1", *argv], tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("argv", "typo", "meant"),
    [
        (["--nproc-per-nod", "2"], "--nproc-per-nod", "--nproc-per-node"),
        (["--max-restart=3"], "--max-restart", "--max-restarts"),
        (["--standalon"], "--standalon", "--standalone"),
        (["--ft-rank-hearbeat-timeout", "5"], "--ft-rank-hearbeat-timeout", None),
    ],
)
def test_typoed_option_says_did_you_mean_on_one_line(
    tmp_path: pathlib.Path, argv: list[str], typo: str, meant: str | None
) -> None:
    (tmp_path / "train.py").write_text("print('never')\n")
    # The script's own options (after the script) are the script's: never checked.
    done = _launch([*argv, "train.py", "--nproc-per-nod", "--whatever"], tmp_path)
    assert done.returncode == ExitCode.USAGE_ERROR, done.stderr
    (line,) = _error_lines(done.stderr)
    assert f"unrecognized option {typo} (did you mean " in line
    if meant is not None:
        assert f"did you mean {meant}?" in line
    assert "Traceback" not in done.stderr


def test_script_arguments_and_negative_values_are_not_options(tmp_path: pathlib.Path) -> None:
    from nvrx.launcher._validation import check_option_names
    from nvrx.launcher.cli import get_parser, launcher_argv

    parser = get_parser()
    argv = ["--ft-max-no-progress-cycles", "-1", "--rdzv-conf", "-x", "-r3", "s.py", "--bogus"]
    check_option_names(parser, launcher_argv(argv, parser))  # no error


@pytest.mark.timeout(120)
def test_misspelt_yaml_key_is_exit_2_naming_both_spellings(tmp_path: pathlib.Path) -> None:
    (tmp_path / "train.py").write_text("print('never')\n")
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(
        "fault_tolerance:\n  rank_hearbeat_timeout: 10\n  calculate_timeouts: true\n"
        "  initial_rank_heartbeat_timeout_s: 3\n"
    )
    done = _launch(["--nproc-per-node", "1", f"--ft-cfg-path={cfg}", "train.py"], tmp_path)
    assert done.returncode == ExitCode.USAGE_ERROR, done.stderr
    (line,) = _error_lines(done.stderr)
    assert "'rank_hearbeat_timeout'" in line
    assert "'rank_heartbeat_timeout'" in line
    # NeMo's own keys (one of them two edits from a field) are not called typos.
    assert "calculate_timeouts" not in line
    assert "initial_rank_heartbeat_timeout_s" not in line
