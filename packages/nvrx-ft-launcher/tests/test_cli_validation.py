"""Every bad value is refused before anything starts: exit 2, option and value named."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import psutil
import pytest
from launcher_testkit import run_launcher_group  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher.cli import main


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--monitor-interval", "nan"], "nan"),
        (["--monitor-interval", "inf"], "inf"),
        (["--monitor-interval", "0"], "0"),
        (["--term-timeout", "nan"], "nan"),
        (["--term-timeout", "1e300"], "1e300"),
        (["--workers-stop-timeout", "inf"], "inf"),
        (["--rdzv-poll-interval", "0"], "0"),
        (["--monitor-ready-timeout=-inf"], "-inf"),
        (["--shutdown-timeout", "-1"], "-1"),
        (["--nproc-per-node", "0"], "0"),
        (["--nproc-per-node", "100000"], "100000"),
        (["--nproc-per-node", "many"], "many"),
        (["--nnodes", "0"], "0"),
        (["--nnodes", "2:1"], "2:1"),
        (["--max-restarts", "-1"], "-1"),
        (["--node-rank", "-1"], "-1"),
        (["--master-port", "70000"], "70000"),
        (["--signals-to-handle", "SIGTERM,SIGFOO"], "SIGFOO"),
        (["--signals-to-handle", "SIGKILL"], "SIGKILL"),
        (["--rdzv-conf", "join_timeout=nan"], "join_timeout=nan"),
        (["--local-ranks-filter", "0,a"], "local_ranks_filter"),
        (["--ft-no-restart-exit-code", "256"], "256"),
        (["--ft-max-no-progress-cycles", "-2"], "-2"),
        (["--ft-rank-heartbeat-timeout", "nan"], "nan"),
        (["--ft-workload-check-interval", "1e300"], "1e300"),
        (["--ft-rank-termination-grace-period", "inf"], "inf"),
        (["--ft-cfg-path", "/no/such/ft.yaml"], "/no/such/ft.yaml"),
        (["--run-path"], "--run-path"),
        (["--ft-metrics-port", "65536"], "65536"),
        (["--ft-metrics-port", "-1"], "-1"),
        (["--ft-metrics-port", "any"], "any"),
        (["--ft-metrics-port", "0", "--ft-metrics-addr", "bad addr"], "bad addr"),
    ],
)
def test_bad_values_exit_2_naming_option_and_value(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert named in err
    assert "Traceback" not in err


def test_usage_error_is_short(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--nproc-per-node", "0", "train.py"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "usage: ft_launcher [options] training_script [training_script_args ...]"
    assert lines[1].startswith("ft_launcher: error: argument --nproc-per-node")
    assert len(lines) == 3, lines


def test_progress_file_must_be_a_regular_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "progress.fifo"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit) as info:
        main(["--ft-progress-file", str(fifo), "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    assert str(fifo) in capsys.readouterr().err


def _run_launcher(args: list[str], runtime: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), NVRX_LAUNCHER_LOGLEVEL="DEBUG")
    env.pop("NVRX_FT_MONITOR_SOCKET", None)
    done: subprocess.CompletedProcess[str] = run_launcher_group(args, env=env, timeout=120)
    return done


def _processes_using(path: pathlib.Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if str(path) in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture
def runtime() -> Iterator[pathlib.Path]:
    """A short private XDG_RUNTIME_DIR (socket paths must fit in 107 bytes)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="nvrx-t-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "argv",
    [
        ["--signals-to-handle", "SIGNOPE", "train.py"],
        ["--nproc-per-node", "2", "--master-port", "99999", "train.py"],
        ["--nnodes", "0", "train.py", "--nproc-per-node", "12"],
    ],
)
def test_nothing_is_left_behind_after_a_usage_error(argv: list[str], runtime: pathlib.Path) -> None:
    # An existing script (never run): a missing one skips the early monitors.
    argv = [__file__ if word == "train.py" else word for word in argv]
    proc = _run_launcher(argv, runtime)
    assert proc.returncode == ExitCode.USAGE_ERROR, proc.stderr
    # these are found by the full parse, after the early monitors started in `runtime`
    assert "early monitors: started" in proc.stderr
    assert list(runtime.iterdir()) == []
    leftovers = _processes_using(runtime)
    for leftover in leftovers:
        leftover.kill()
    assert leftovers == []


@pytest.mark.timeout(120)
def test_version_prints_and_starts_nothing(runtime: pathlib.Path) -> None:
    from importlib.metadata import version

    proc = _run_launcher(["--version"], runtime)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ft_launcher {version('nvrx-ft-launcher')} ")
    assert "torch" in proc.stdout
    assert list(runtime.iterdir()) == []
    assert "early monitors: no" in proc.stderr


def test_a_job_key_file_others_can_read_is_refused(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "job.key"
    key.write_text("k" * 32)
    key.chmod(0o644)
    monkeypatch.setenv("NVRX_JOB_KEY_FILE", str(key))
    with pytest.raises(SystemExit) as info:
        main(["train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    assert "NVRX_JOB_KEY_FILE" in capsys.readouterr().err
