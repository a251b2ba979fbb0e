"""Every documented environment variable is checked at start-up: a bad value is a usage
error (exit 2) naming the variable and the value, before a monitor or a rank exists;
the values torchrun and NVRx accept stay accepted."""

from __future__ import annotations

import os
import pathlib

import pytest
from launcher_testkit import run_launcher_group  # type: ignore[import-not-found]

from nvrx.launcher import ExitCode
from nvrx.launcher.cli import main

pytestmark = pytest.mark.timeout(120)

_PLAIN = ("NVRX_LAUNCHER_LOGLEVEL", "FT_LAUNCHER_LOGLEVEL", "SLURM_PROCID", "GROUP_RANK")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("PET_", "SLURM_", "NVRX_")) or name in _PLAIN:
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("NVRX_LAUNCHER_LOGLEVEL", "garbage"),
        ("NVRX_LAUNCHER_LOGLEVEL", "10"),
        ("FT_LAUNCHER_LOGLEVEL", "verbose"),
        ("PET_NPROC_PER_NODE", "abc"),
        ("PET_NPROC_PER_NODE", "0"),
        ("PET_MAX_RESTARTS", "x"),
        ("PET_MAX_RESTARTS", "-1"),
        ("PET_NNODES", "2:1"),
        ("PET_MASTER_PORT", "70000"),
        ("PET_MONITOR_INTERVAL", "nan"),
        ("PET_STANDALONE", "garbage"),
        ("PET_FT_RANK_HEARTBEAT_TIMEOUT", "nan"),
        ("SLURM_PROCID", "-1"),
        ("GROUP_RANK", "first"),
        ("SLURM_RESTART_CNT", "x"),
        ("SLURM_JOB_ID", "../../etc"),
        ("NVRX_SEGMENT_ID", "a b"),
        ("NVRX_GPUS_PER_NUMA", "0"),
        ("OMP_NUM_THREADS", "zero"),
    ],
)
def test_bad_variable_exits_2_naming_it_and_its_value(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as info:
        main(["train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert f"environment variable {variable}" in err, err
    assert value in err, err
    assert "Traceback" not in err


def test_the_command_line_wins_over_a_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "abc")
    with pytest.raises(SystemExit) as info:
        main(["--nproc-per-node", "0", "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert "argument --nproc-per-node: invalid value '0'" in err  # the option, not the variable


@pytest.mark.parametrize(
    "env",
    [
        {"NVRX_LAUNCHER_LOGLEVEL": "debug"},
        {"FT_LAUNCHER_LOGLEVEL": "WARNING"},
        {"NVRX_LAUNCHER_LOGLEVEL": "", "FT_LAUNCHER_LOGLEVEL": "ERROR"},
        {"PET_STANDALONE": "1", "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "0"},
        {"PET_NPROC_PER_NODE": "cpu", "PET_STANDALONE": "0"},
        {"SLURM_PROCID": "3", "GROUP_RANK": "0", "SLURM_RESTART_CNT": "2"},
        {"SLURM_JOB_ID": "123456", "SLURM_ARRAY_JOB_ID": "77_3"},
        {"OMP_NUM_THREADS": "4,2", "NVRX_GPUS_PER_NUMA": "4", "NVRX_SEGMENT_ID": "seg-1"},
    ],
)
def test_values_torchrun_and_nvrx_accept_are_accepted(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0, capsys.readouterr().err


@pytest.mark.multiprocess
def test_a_real_launcher_refuses_a_garbage_log_level(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    for variable, value in (("NVRX_LAUNCHER_LOGLEVEL", "garbage"), ("PET_NPROC_PER_NODE", "x")):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "NVRX_"))}
        env[variable] = value
        done = run_launcher_group([str(script)], env=env, timeout=100)
        assert done.returncode == ExitCode.USAGE_ERROR, done.stderr
        assert f"environment variable {variable}: invalid value {value!r}" in done.stderr
        assert "must not run" not in done.stderr
