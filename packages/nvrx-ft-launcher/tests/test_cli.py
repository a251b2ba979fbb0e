"""The command line: torchrun's options, FT options, deprecated spellings, usage errors."""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys

import pytest

from nvrx.ft import FaultToleranceConfig
from nvrx.launcher import ExitCode
from nvrx.launcher.cli import get_parser, main


def test_help_documents_torchrun_ft_and_launcher_options() -> None:
    text = get_parser().format_help()
    for option in (
        "--nproc-per-node",
        "--rdzv-endpoint",
        "--max-restarts",
        "--standalone",
        "--term-timeout",
        "--workers-stop-timeout",
        "--ft-cfg-path",
        "--ft-max-no-progress-restarts",
        "--ft-progress-file",
        "--warm-spares",
        "--warm-spare-preload",
    ):
        assert option in text
    without_effect = {
        field
        for field in FaultToleranceConfig.field_names()
        if FaultToleranceConfig.field_spec(field).without_effect is not None
    }
    assert without_effect  # NVRx fields accepted for compatibility
    for field in FaultToleranceConfig.field_names():
        if field not in without_effect:
            assert f"--ft-{field.replace('_', '-')}" in text, field
    # (some NVRx spellings without effect as fields are aliases of launcher options, so
    # they still show as those options' second spelling)
    for hidden in ("skip_section_response", "restart_check_interval", "attribution_endpoint"):
        assert hidden in without_effect
        assert f"--ft-{hidden.replace('_', '-')} " not in text, hidden
    assert "--ft-param-" not in text  # deprecated spellings stay hidden
    # Hidden is not refused: NVRx commands keep working.
    args = get_parser().parse_args(["--ft-skip-section-response", "true", "train.py"])
    assert args.ft_skip_section_response == "true"
    for code in ExitCode:
        assert f"{int(code):>3}  " in text


def test_underscore_spellings_and_pet_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_TERM_TIMEOUT", "7")
    args = get_parser().parse_args(
        [
            "--max_restarts",
            "4",
            "--workers_stop_timeout",
            "2.5",
            "--ft-rank_heartbeat_timeout",
            "none",
            "train.py",
            "--lr",
            "1",
        ]
    )
    assert args.nproc_per_node == "3"
    assert args.term_timeout == 7.0
    assert args.max_restarts == 4
    assert args.workers_stop_timeout == 2.5
    assert FaultToleranceConfig.from_args(args).rank_heartbeat_timeout is None
    assert args.training_script == "train.py"
    assert args.training_script_args == ["--lr", "1"]


def test_cli_overrides_yaml_only_when_given(tmp_path: pytest.TempPathFactory) -> None:
    cfg = FaultToleranceConfig(rank_heartbeat_timeout=11.0, enable_nic_monitor=True)
    path = f"{tmp_path}/ft.yaml"
    cfg.to_yaml_file(path)
    args = get_parser().parse_args(
        ["--ft-cfg-path", path, "--ft-initial-rank-heartbeat-timeout", "9", "x.py"]
    )
    got = FaultToleranceConfig.from_args(args)
    assert got.rank_heartbeat_timeout == 11.0
    assert got.enable_nic_monitor is True
    assert got.initial_rank_heartbeat_timeout == 9.0


def test_deprecated_ft_param_spelling_works_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="nvrx.launcher"):
        args = get_parser().parse_args(
            ["--ft-param-rank_heartbeat_timeout", "12", "--ft-param-log-level=DEBUG", "x.py"]
        )
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.rank_heartbeat_timeout == 12.0
    assert cfg.log_level == logging.DEBUG
    assert "--ft-param-rank_heartbeat_timeout is deprecated" in caplog.text
    assert "--ft-rank-heartbeat-timeout" in caplog.text


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--ft-rank-heartbeat-timeout", "soon"], "soon"),
        (["--ft-rank-termination-signal", "SIGNOPE"], "SIGNOPE"),
        (["--workers-stop-timeout", "-1"], "-1"),
        (["--ft-max-no-progress-restarts", "many"], "many"),
        (["--nnodes", "1:2:3"], "1:2:3"),
        (["--nproc-per-node", "lots"], "lots"),
        (["--ft-param-safety-factor", "0.5"], "0.5"),
        (["--warm-spare-preload", "torch,no_such_module_xyz"], "no_such_module_xyz"),
        (["--warm-spare-preload", "torch.9bad"], "torch.9bad"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_value(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    err = capsys.readouterr().err
    assert named in err
    assert "usage: ft_launcher" in err


def test_usage_error_exit_code_of_the_real_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nvrx.launcher", "--ft-rank-heartbeat-timeout", "abc", "t.py"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == ExitCode.USAGE_ERROR, proc.stderr
    assert "'abc'" in proc.stderr


def test_term_timeout_falls_back_to_torchruns_shutdown_timeout() -> None:
    from nvrx.launcher.cli import _term_timeout

    parse = get_parser().parse_args
    assert _term_timeout(parse(["x.py"])) == 1800.0
    assert _term_timeout(parse(["--shutdown-timeout", "40", "x.py"])) == 40.0
    assert _term_timeout(parse(["--shutdown-timeout", "40", "--term-timeout", "5", "x.py"])) == 5.0


def test_defaults_of_the_monitor_wait_and_the_spare_preload(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.py").touch()  # the training script must exist
    monkeypatch.chdir(tmp_path)
    from nvrx.ft import RANK_MONITOR_INIT_TIMEOUT
    from nvrx.launcher._spares import DEFAULT_PRELOAD
    from nvrx.launcher.cli import _options

    parser = get_parser()
    options = _options(parser.parse_args(["--standalone", "x.py"]), parser)
    assert options.warm_spare_preload == DEFAULT_PRELOAD
    assert options.monitor_ready_timeout == RANK_MONITOR_INIT_TIMEOUT
    given = parser.parse_args(["--standalone", "--warm-spare-preload", "json", "x.py"])
    assert _options(given, parser).warm_spare_preload == ("json",)
