"""FaultToleranceConfig from kwargs, YAML and the command line; every bad value rejected."""

from __future__ import annotations

import argparse
import logging
import pathlib
import signal

import pytest
import yaml

from nvrx.ft import CLI_NONE, FaultToleranceConfig, add_ft_arguments


def test_defaults_do_not_enforce_out_of_section_and_use_catchable_signal() -> None:
    cfg = FaultToleranceConfig()
    assert cfg.rank_out_of_section_timeout is None
    assert cfg.rank_section_timeouts == {}
    assert cfg.rank_termination_signal is signal.SIGTERM
    assert cfg.workload_check_interval <= 0.25
    assert cfg.enable_nic_monitor is False


def test_from_kwargs_normalises_types() -> None:
    cfg = FaultToleranceConfig.from_kwargs(
        workload_check_interval="0.5",
        rank_heartbeat_timeout="null",
        initial_rank_heartbeat_timeout=3,
        rank_section_timeouts={"step": 2, "ckpt": None},
        rank_termination_signal="usr1",
        stack_dump_signal="none",
        log_level="warn",
        enable_nic_monitor="yes",
        link_down_path_template="/x/{nic}/c",
    )
    assert cfg.workload_check_interval == 0.5
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.initial_rank_heartbeat_timeout == 3.0
    assert cfg.rank_section_timeouts == {"step": 2.0, "ckpt": None}
    assert cfg.rank_termination_signal is signal.SIGUSR1
    assert cfg.stack_dump_signal is None
    assert cfg.log_level == logging.WARNING
    assert cfg.enable_nic_monitor is True


def test_from_kwargs_unknown_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = FaultToleranceConfig.from_kwargs(restart_check_interval=60.0, exp_dir="/x")
    assert cfg == FaultToleranceConfig()
    assert "exp_dir" in caplog.text
    assert "restart_check_interval" in caplog.text
    # NVRx-only fields are accepted even when strict; other unknown names are not.
    FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, restart_check_interval=1)
    with pytest.raises(ValueError, match="exp_dir"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, exp_dir="/x")


def test_misspelt_field_is_always_an_error() -> None:
    with pytest.raises(ValueError, match="did you mean 'rank_heartbeat_timeout'"):
        FaultToleranceConfig.from_kwargs(rank_heartbeat_timout=3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workload_check_interval", 0),
        ("workload_check_interval", -1.0),
        ("workload_check_interval", "fast"),
        ("workload_check_interval", None),
        ("workload_check_interval", True),
        ("workload_check_interval", float("nan")),
        ("initial_rank_heartbeat_timeout", 0),
        ("rank_heartbeat_timeout", "-3"),
        ("rank_heartbeat_timeout", float("inf")),
        ("rank_section_timeouts", {"step": 0}),
        ("rank_section_timeouts", {"": 1.0}),
        ("rank_section_timeouts", ["step"]),
        ("rank_section_timeouts", "step"),
        ("rank_section_timeouts", "step:1,step:2"),
        ("rank_out_of_section_timeout", "abc"),
        ("node_health_check_interval", 0),
        ("safety_factor", 0.5),
        ("safety_factor", "x"),
        ("min_calculated_timeout", -1),
        ("rank_termination_signal", "SIGNOPE"),
        ("rank_termination_signal", 999),
        ("rank_termination_signal", None),
        ("rank_termination_grace_period", 0),
        ("stack_dump_signal", "SIGKILL"),
        ("stack_dump_signal", "bogus"),
        ("log_level", "LOUD"),
        ("log_level", 5),
        ("log_level", None),
        ("enable_gpu_monitor", "maybe"),
        ("enable_nic_monitor", 2),
        ("pci_topo_file", 3),
        ("link_down_path_template", "/sys/no/placeholder"),
    ],
)
def test_bad_values_name_the_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field) as info:
        FaultToleranceConfig(**{field: value})  # type: ignore[arg-type]
    assert repr(value)[:10] in str(info.value) or field == "rank_section_timeouts"


def test_yaml_round_trip(tmp_path: pathlib.Path) -> None:
    cfg = FaultToleranceConfig(
        rank_section_timeouts={"a": 1.5, "b": None},
        rank_out_of_section_timeout=7.0,
        initial_rank_heartbeat_timeout=None,
        rank_termination_signal=signal.SIGINT,
        stack_dump_signal=None,
        log_level=logging.DEBUG,
        enable_nic_monitor=True,
        pci_topo_file="/topo.xml",
    )
    path = tmp_path / "ft.yaml"
    cfg.to_yaml_file(path)
    assert FaultToleranceConfig.from_yaml_file(path) == cfg
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_yaml_finds_nested_section_and_nulls(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cfg.yaml"
    doc = {
        "trainer": {"max_steps": 3},
        "callbacks": [
            {"other": 1},
            {"ft": {"fault_tolerance": {"rank_heartbeat_timeout": None, "safety_factor": 2}}},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.safety_factor == 2.0


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (b"fault_tolerance: {rank_heartbeat_timeout: [1, 2\n", "not a valid YAML file"),
        (b"fault_tolerance:\n  rank_heartbeat_timeout: \xff\xfe\n", "not a valid YAML file"),
        (b"fault_tolerance:\n  rank_heartbeat_timout: 3\n", "did you mean"),
        (b"fault_tolerance:\n  safety_factor: 0.1\n", "safety_factor"),
        (b"fault_tolerance: [1, 2]\n", "not a mapping"),
    ],
)
def test_bad_yaml_files_name_the_file(tmp_path: pathlib.Path, text: bytes, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=match) as info:
        FaultToleranceConfig.from_yaml_file(path)
    assert str(path) in str(info.value)


def test_yaml_without_section_or_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("a: 1\n")
    with pytest.raises(ValueError, match="fault_tolerance"):
        FaultToleranceConfig.from_yaml_file(path)
    with pytest.raises(FileNotFoundError):
        FaultToleranceConfig.from_yaml_file(tmp_path / "missing.yaml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_ft_arguments(parser)
    return parser


def test_every_field_has_an_option_with_none_default() -> None:
    args = _parser().parse_args([])
    for name in FaultToleranceConfig.field_names():
        assert getattr(args, f"ft_{name}") is None
    assert args.ft_cfg_path is None
    assert FaultToleranceConfig.from_args(args) == FaultToleranceConfig()


def test_cli_overrides_yaml_only_when_given(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "ft.yaml"
    FaultToleranceConfig(
        enable_nic_monitor=False, rank_heartbeat_timeout=9.0, safety_factor=3.0
    ).to_yaml_file(path)
    args = _parser().parse_args(
        [
            "--ft-cfg-path",
            str(path),
            "--ft-rank-heartbeat-timeout",
            "null",
            "--ft-initial_rank_heartbeat_timeout=none",
            "--ft-rank-section-timeouts",
            "step:3,ckpt:none",
            "--ft-rank-termination-signal",
            "SIGUSR1",
            "--ft-log-level",
            "debug",
        ]
    )
    assert args.ft_rank_heartbeat_timeout == CLI_NONE
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg.rank_heartbeat_timeout is None
    assert cfg.initial_rank_heartbeat_timeout is None
    assert cfg.safety_factor == 3.0  # from YAML, not overridden
    assert cfg.enable_nic_monitor is False  # no CLI default overrides YAML
    assert cfg.rank_section_timeouts == {"step": 3.0, "ckpt": None}
    assert cfg.rank_termination_signal is signal.SIGUSR1
    assert cfg.log_level == logging.DEBUG


def test_cli_bool_flag_forms() -> None:
    assert FaultToleranceConfig.from_args(
        _parser().parse_args(["--ft-enable-nic-monitor"])
    ).enable_nic_monitor
    assert not FaultToleranceConfig.from_args(
        _parser().parse_args(["--ft-enable-gpu-monitor", "false"])
    ).enable_gpu_monitor


@pytest.mark.parametrize(
    "argv",
    [
        ["--ft-rank-heartbeat-timeout", "soon"],
        ["--ft-workload-check-interval", "none"],
        ["--ft-safety-factor", "0.1"],
        ["--ft-rank-termination-signal", "SIGFOO"],
        ["--ft-log-level", "chatty"],
        ["--ft-rank-section-timeouts", "step"],
        ["--ft-enable-nic-monitor", "perhaps"],
    ],
)
def test_bad_cli_values_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(argparse.ArgumentError, match=argv[1]):
        _parser().parse_args(argv)
