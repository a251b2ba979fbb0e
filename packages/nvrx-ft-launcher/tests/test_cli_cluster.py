"""The cluster features' options: bad values exit 2 naming option (or variable) and value."""

from __future__ import annotations

import os
import pathlib

import pytest

from nvrx.launcher import ExitCode
from nvrx.launcher.cli import get_parser, main


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--ft-node-health-check-cmd", "/no/such/check --all"], {}, "/no/such/check"),
        (["--ft-node-health-check-cmd", "'unclosed"], {}, "'unclosed"),
        (["--ft-node-health-check-cmd", ""], {}, "--ft-node-health-check-cmd"),
        (["--ft-per-cycle-applog-prefix", "relative/job.log"], {}, "relative/job.log"),
        (["--ft-per-cycle-applog-prefix", "/no/such/dir/job.log"], {}, "/no/such/dir"),
        (["--ft-cycle-info-job-id", "a\nb"], {}, "--ft-cycle-info-job-id"),
        (["--ft-cycle-info-dir", "/no/such/cycles"], {}, "/no/such/cycles"),
        (["--ft-use-infra-group-rank=maybe"], {}, "maybe"),
        (
            ["--ft-standby-nodes", "--nnodes=1:2", "--rdzv-backend=etcd", "--rdzv-endpoint=h:1"],
            {},
            "--ft-standby-nodes: needs --rdzv-backend c10d or etcd-v2",
        ),
        ([], {"NVRX_GPUS_PER_NUMA": "two"}, "NVRX_GPUS_PER_NUMA: invalid value 'two'"),
        ([], {"PET_FT_NODE_HEALTH_CHECK_CMD": "/no/such/check"}, "PET_FT_NODE_HEALTH_CHECK_CMD"),
    ],
)
def test_bad_values_exit_2_naming_them(
    argv: list[str],
    env: dict[str, str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        main([*argv, "train.py"])
    assert info.value.code == ExitCode.USAGE_ERROR
    assert named in capsys.readouterr().err


def test_the_options_and_their_pet_variables_parse(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PET_FT_CYCLE_INFO_JOB_ID", "job-7")
    parser = get_parser()
    prefix = str(tmp_path / "job.log")
    args = parser.parse_args(
        [
            "--ft-node-health-check-cmd",
            "true --verbose",
            f"--ft_per_cycle_applog_prefix={prefix}",
            "--ft-use-infra-group-rank=True",
            "--ft-standby-nodes",
            "train.py",
        ]
    )
    assert args.ft_node_health_check_cmd == "true --verbose"
    assert args.ft_per_cycle_applog_prefix == prefix
    assert args.ft_cycle_info_job_id == "job-7"
    assert args.ft_use_infra_group_rank is True
    assert args.ft_standby_nodes is True
    assert parser.parse_args(["train.py"]).ft_standby_nodes is False
    assert os.path.isdir(tmp_path)


def test_redirects_with_per_cycle_logs_is_said_to_have_no_effect(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "x.py").touch()  # the training script must exist
    monkeypatch.chdir(tmp_path)
    from nvrx.launcher.cli import _options

    parser = get_parser()
    prefix = f"--ft-per-cycle-applog-prefix={tmp_path / 'job.log'}"
    with caplog.at_level("WARNING", logger="nvrx.launcher"):
        _options(parser.parse_args(["--standalone", prefix, "x.py"]), parser)
        assert "--redirects" not in caplog.text
        _options(parser.parse_args(["--standalone", "--redirects=3", prefix, "x.py"]), parser)
    assert "--redirects 3 has no effect with --ft-per-cycle-applog-prefix" in caplog.text
