"""NVRx's command lines work unchanged: its spellings, its options, the script's own arguments."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import textwrap
from collections.abc import Callable

import pytest
from launcher_testkit import Launcher, run_launcher_group  # type: ignore[import-not-found]

from nvrx.ft import FaultToleranceConfig
from nvrx.launcher._nvrx_only import NVRX_ONLY_OPTIONS, _Given, warn_without_effect
from nvrx.launcher.cli import (
    TORCHRUN_FLAGS,
    add_launcher_options,
    early_settings,
    get_parser,
    launcher_argv,
)

SCRIPT_ARGS = ["--n", "20", "--nproc", "4", "--log", "x", "--max", "3", "--nproc-per-node", "12"]


def test_nemo_run_command_line() -> None:
    args = get_parser().parse_args(
        [
            "--ft-param-workload_check_interval",
            "2",
            "--ft-param-initial_rank_heartbeat_timeout",
            "1800",
            "--ft-param-rank_heartbeat_timeout",
            "300",
            "--ft-param-rank_termination_signal",
            "SIGKILL",
            "--ft-param-log_level",
            "INFO",
            "--max-restarts",
            "3",
            "--ignore-missing-fault-tol-cfg",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "node0:29500",
            "--rdzv-id",
            "job1",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "8",
            "--node-rank",
            "0",
            "--tee",
            "3",
            "--no-python",
            "train.sh",
        ]
    )
    cfg = FaultToleranceConfig.from_args(args)
    assert (cfg.workload_check_interval, cfg.rank_heartbeat_timeout) == (2.0, 300.0)
    assert cfg.initial_rank_heartbeat_timeout == 1800.0
    assert cfg.rank_termination_signal.name == "SIGKILL"
    assert args.max_restarts == 3
    assert args.no_python
    assert args.tee == "3"
    assert args.training_script == "train.sh"


def test_nemo_framework_launcher_underscore_spellings(tmp_path: pathlib.Path) -> None:
    job_yaml = tmp_path / "job.yaml"
    job_yaml.write_text(
        "training:\n  fault_tolerance:\n    rank_heartbeat_timeout: 77\n"
        "    max_subsequent_job_failures: 2\n"
    )
    args = get_parser().parse_args(
        [
            f"--fault-tol-cfg-path={job_yaml}",
            "--ignore-missing-fault-tol-cfg",
            "--rdzv_id=123",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=host:29500",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "4",
            "--max-restarts",
            "1",
            "train.py",
            "--config-name",
            "x",
        ]
    )
    assert (args.rdzv_id, args.rdzv_backend, args.rdzv_endpoint) == ("123", "c10d", "host:29500")
    assert args.nproc_per_node == "4"
    assert FaultToleranceConfig.from_args(args).rank_heartbeat_timeout == 77.0
    assert args.training_script_args == ["--config-name", "x"]


def test_megatron_section_flags() -> None:
    args = get_parser().parse_args(
        [
            "--ft-param-rank_section_timeouts=setup:600,step:180,checkpointing:420",
            "--ft-rank_out_of_section_timeout=300",
            "pretrain.py",
        ]
    )
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.rank_section_timeouts == {"setup": 600.0, "step": 180.0, "checkpointing": 420.0}
    assert cfg.rank_out_of_section_timeout == 300.0


def test_every_field_option_has_every_nvrx_spelling() -> None:
    options = get_parser()._option_string_actions
    for name in FaultToleranceConfig.cli_field_names():
        dashed = name.replace("_", "-")
        for flag in (
            f"--ft-{dashed}",
            f"--ft-{name}",
            f"--ft-param-{name}",
            f"--ft-param-{dashed}",
            f"--ft_param_{name}",
        ):
            assert flag in options, flag
            assert options[flag].dest == f"ft_{name}"


def test_empty_config_file_plus_options_is_a_config(tmp_path: pathlib.Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    args = get_parser().parse_args(
        ["--ft-cfg-path", str(empty), "--ft-rank-heartbeat-timeout", "42", "x.py"]
    )
    assert FaultToleranceConfig.from_args(args).rank_heartbeat_timeout == 42.0


def test_progress_rule_options_map_onto_ours() -> None:
    parse = get_parser().parse_args
    args = parse(
        [
            "--ft-max-no-progress-cycles",
            "5",
            "--ft-min-progress-iterations",
            "200",
            "--ft-checkpoint-iteration-file",
            "/ckpt/iter.txt",
            "--ft-no-restart-exit-code",
            "17",
            "x.py",
        ]
    )
    assert args.ft_max_no_progress_restarts == 5
    assert args.ft_min_progress_iterations == 200
    assert args.ft_progress_file == "/ckpt/iter.txt"
    assert args.ft_no_restart_exit_code == 17
    assert parse(["x.py"]).ft_no_restart_exit_code == 93
    assert parse(["--ft-max_no_progress_cycles", "-1", "x.py"]).ft_max_no_progress_restarts == -1


def _sample(entry_choices: tuple[str, ...] | None) -> str:
    return entry_choices[-1] if entry_choices else "7"


def test_nvrx_only_options_accepted_and_each_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    parser = get_parser()
    argv: list[str] = []
    expected = []
    for entry in NVRX_ONLY_OPTIONS:
        action = parser._option_string_actions[entry.flags[-1]]
        if not isinstance(action, _Given):
            continue  # an option of nvrx.ft's (a config field): tested there
        argv += [entry.flags[-1], _sample(entry.choices)]
        expected.append(action.option_strings[0])
    args = parser.parse_args([*argv, "x.py"])
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        warn_without_effect(args, parser)
    assert expected, "every NVRx-only option became a config field"
    for flag in expected:
        lines = [r.message for r in caplog.records if r.message.startswith(f"{flag} ")]
        assert len(lines) == 1, (flag, lines)
        assert "has no effect" in lines[0]


def test_nvrx_only_values_that_describe_our_behaviour_are_not_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parser = get_parser()
    args = parser.parse_args(["--restart-policy", "any-failed", "x.py"])
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        warn_without_effect(args, parser)
    assert "restart-policy" not in caplog.text


def test_nvrx_only_choices_are_still_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        get_parser().parse_args(["--ft-rdzv-impl", "fancy", "x.py"])
    assert info.value.code == 2
    assert "fancy" in capsys.readouterr().err


@pytest.mark.parametrize("abbreviation", ["--nproc", "--max", "--log", "--n", "--ft-rank-heart"])
def test_launcher_options_match_full_names_only(
    abbreviation: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        get_parser().parse_args([abbreviation, "2", "x.py"])
    assert info.value.code == 2
    assert abbreviation in capsys.readouterr().err


def test_arguments_after_the_script_belong_to_the_script() -> None:
    args = get_parser().parse_args(["--nproc-per-node", "2", "train.py", *SCRIPT_ARGS])
    assert args.nproc_per_node == "2"
    assert args.training_script_args == SCRIPT_ARGS


def test_early_parse_never_reads_the_scripts_arguments(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").touch()
    monkeypatch.chdir(tmp_path)
    settings = early_settings(["--ft-rank-heartbeat-timeout", "9", "train.py", *SCRIPT_ARGS])
    assert settings is not None
    assert settings.local_world_size == 1
    assert settings.ft_config.rank_heartbeat_timeout == 9.0
    assert early_settings(["--nproc-per-node", "1000000", "train.py"]) is None
    assert early_settings(["--nproc-per-node", "gpu", "train.py"]) is None
    assert early_settings(["--version"]) is None
    assert early_settings(["missing.py"]) is None  # the full parse refuses it
    assert early_settings(["-m", "missing_module"]) is not None  # a module: not a path


@pytest.mark.parametrize(
    "argv",
    [
        ["train.py", "--nproc-per-node", "3"],
        ["--rdzv-endpoint", "h:1", "--nproc_per_node=3", "train.py", "-x"],
        ["-r3", "-t", "3", "--standalone", "-m", "pkg.mod", "--n", "1"],
        ["--ft-enable-nic-monitor", "--nnodes", "1", "--no-python", "run.sh", "a"],
        ["--ft-enable-gpu-monitor", "false", "--max-restarts", "2", "t.py"],
        ["--ft-max-no-progress-cycles", "-1", "--ft-rdzv-impl", "barrier", "t.py", "-h"],
    ],
)
def test_early_boundary_agrees_with_the_real_parser(argv: list[str]) -> None:
    real = get_parser().parse_args(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_launcher_options(pre)
    mine = launcher_argv(argv, pre)
    assert argv[len(mine)] == real.training_script
    assert argv[len(mine) + 1 :] == real.training_script_args


def test_torchrun_flags_table_matches_torch() -> None:
    from torch.distributed.run import get_args_parser

    flags = {o for a in get_args_parser()._actions if a.nargs == 0 for o in a.option_strings}
    assert flags <= TORCHRUN_FLAGS, flags - TORCHRUN_FLAGS


def _ours() -> list[argparse.Action]:
    parser = argparse.ArgumentParser(add_help=False)
    add_launcher_options(parser)
    return [a for a in parser._actions if a.option_strings and a.default is not argparse.SUPPRESS]


@pytest.mark.parametrize("dest", sorted({a.dest for a in _ours()}))
def test_every_option_we_add_reads_its_pet_variable(
    dest: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    variable = f"PET_{dest.upper()}"
    monkeypatch.setenv(variable, "not-a-value-xyz")
    parser = get_parser()
    action = next(a for a in parser._actions if a.dest == dest and a.option_strings)
    refused: int | str | None = None
    try:
        args = parser.parse_args(["x.py"])
    except SystemExit as exc:
        refused = exc.code
    if refused is not None:  # the option's type refuses the value: say where it came from
        err = capsys.readouterr().err
        assert refused == 2
        assert variable in err
        assert "not-a-value-xyz" in err
        return
    got = getattr(args, dest)
    if action.nargs == 0:
        assert got is True  # a flag: any value other than 0/false/no/off sets it
    else:
        assert got == "not-a-value-xyz"


def test_pet_variables_give_valid_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_FT_RANK_HEARTBEAT_TIMEOUT", "33")
    monkeypatch.setenv("PET_FT_NO_RESTART_EXIT_CODE", "19")
    monkeypatch.setenv("PET_WARM_SPARES", "1")
    monkeypatch.setenv("PET_FT_MAX_NO_PROGRESS_RESTARTS", "0")
    args = get_parser().parse_args(["x.py"])
    assert FaultToleranceConfig.from_args(args).rank_heartbeat_timeout == 33.0
    assert args.ft_no_restart_exit_code == 19
    assert args.warm_spares is True
    assert args.ft_max_no_progress_restarts == 0
    # the command line still wins over the environment, as in torchrun
    args = get_parser().parse_args(["--ft-no-restart-exit-code", "20", "x.py"])
    assert args.ft_no_restart_exit_code == 20


_ARGV_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import psutil
    monitors = [
        p for p in psutil.Process(os.getppid()).children()
        if "nvrx.ft._monitor_main" in " ".join(p.cmdline())
    ]
    with open(os.environ["ARGV_OUT"], "w") as out:
        json.dump({"argv": sys.argv[1:], "monitors": len(monitors)}, out)
    """
)


@pytest.mark.timeout(180)
def test_real_launch_passes_script_arguments_untouched(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "show_argv.py"
    script.write_text(_ARGV_SCRIPT)
    empty = tmp_path / "ft.yaml"
    empty.write_text("")
    out = tmp_path / "argv.json"
    env = dict(os.environ, ARGV_OUT=str(out), NVRX_LAUNCHER_LOGLEVEL="DEBUG", OMP_NUM_THREADS="1")
    env.pop("NVRX_FT_MONITOR_SOCKET", None)
    done = run_launcher_group(
        [
            f"--fault-tol-cfg-path={empty}",
            "--ignore-missing-fault-tol-cfg",
            "--ft-param-rank_heartbeat_timeout",
            "60",
            "--ft-rdzv-impl",
            "barrier",
            "--standalone",
            "--nproc_per_node",
            "1",
            "--monitor-interval",
            "0.1",
            str(script),
            *SCRIPT_ARGS,
        ],
        env=env,
        timeout=150,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    got = json.loads(out.read_text())
    assert got == {"argv": SCRIPT_ARGS, "monitors": 1}, log
    assert "early monitors: started" in log
    assert "do not match" not in log  # the early parse read what the full parse read
    assert "--ft-rdzv-impl barrier is accepted for NVRx compatibility" in log
    assert log.count("--ft-param-rank_heartbeat_timeout is deprecated") == 1


def test_progress_rule_read_from_the_config_file_unless_given(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.py").touch()  # the training script must exist
    monkeypatch.chdir(tmp_path)
    from nvrx.launcher.cli import _options

    cfg = tmp_path / "ft.yaml"
    cfg.write_text(
        "fault_tolerance:\n  max_no_progress_cycles: 7\n  min_progress_iterations: 50\n"
        f"  checkpoint_iteration_file: {tmp_path}/iter.txt\n"
    )
    parser = get_parser()
    options = _options(parser.parse_args(["--ft-cfg-path", str(cfg), "x.py"]), parser)
    assert options.max_no_progress_restarts == 7
    assert options.min_progress_iterations == 50
    assert options.progress_file == f"{tmp_path}/iter.txt"
    given = ["--ft-cfg-path", str(cfg), "--ft-max-no-progress-cycles", "-1", "x.py"]
    assert _options(parser.parse_args(given), parser).max_no_progress_restarts == 0
    defaults = _options(parser.parse_args(["x.py"]), parser)
    assert (defaults.max_no_progress_restarts, defaults.min_progress_iterations) == (3, 1)
    assert defaults.progress_file is None


@pytest.mark.timeout(240)
def test_no_restart_exit_code_is_what_the_progress_rule_exits_with(
    start_launcher: Callable[..., Launcher],
) -> None:
    launcher = start_launcher(
        [
            "--nproc-per-node",
            "1",
            "--max-restarts",
            "10",
            "--ft-max-no-progress-cycles",
            "1",
            "--ft-checkpoint-iteration-file",
            "{out}/progress",
            "--ft-no-restart-exit-code",
            "17",
            "--ft-journal",
            "{out}/journal.jsonl",
        ],
        ["--steps", "6", "--fault", "exit:0:3:*"],
    )
    assert launcher.wait(200) == 17, launcher.log()
    assert "no progress in" in launcher.log()
    finished = json.loads((launcher.out / "journal.jsonl").read_text().splitlines()[-1])
    assert finished["event"] == "finished"
    assert finished["exit_code"] == 17


def test_nvrx_spellings_of_config_field_options_set_the_field() -> None:
    args = get_parser().parse_args(
        ["--ft-storage-health-check-path", "/data", "--ft_segment", "4", "x.py"]
    )
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.storage_healthcheck_path == "/data"
    assert cfg.segment == 4


def test_get_args_parser_is_ft_launchers_parser_under_nvrx_name() -> None:
    import nvrx.launcher

    args = nvrx.launcher.get_args_parser().parse_args(
        ["--nproc-per-node", "2", "--ft-rank-heartbeat-timeout", "12", "train.py", "--lr", "1"]
    )
    assert args.nproc_per_node == "2"
    assert args.training_script == "train.py"
    assert args.training_script_args == ["--lr", "1"]
    assert "get_args_parser" in nvrx.launcher.__all__
