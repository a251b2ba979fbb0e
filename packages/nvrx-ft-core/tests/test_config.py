"""FaultToleranceConfig from kwargs, YAML and the command line; every bad value rejected."""

from __future__ import annotations

import argparse
import logging
import pathlib
import signal

import pytest
import yaml

from nvrx.ft import (
    CLI_NONE,
    MAX_DURATION_S,
    FaultToleranceConfig,
    add_config_arguments,
    add_ft_arguments,
)
from nvrx.ft import config as config_module


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


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    """Each test sees the once-per-process without-effect warnings afresh."""
    config_module._warned_without_effect.clear()
    config_module._warned_unknown.clear()


def test_from_kwargs_unknown_fields(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = FaultToleranceConfig.from_kwargs(restart_check_interval=60.0, exp_dir="/x")
    assert cfg == FaultToleranceConfig()
    assert "exp_dir" in caplog.text
    # An NVRx field without effect here is a field, accepted even when strict, and says so.
    assert "restart_check_interval=60.0 is accepted without effect" in caplog.text
    FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, restart_check_interval=1)
    with pytest.raises(ValueError, match="exp_dir"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, exp_dir="/x")


def test_misspelt_field_is_one_warning_with_a_suggestion_unless_strict(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Changed on purpose (issue 12 item 4): a suggestion never makes a lenient load raise.
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        cfg = FaultToleranceConfig.from_kwargs(rank_heartbeat_timout=3, max_rank_restarts=2)
    assert cfg == FaultToleranceConfig()
    records = [r for r in caplog.records if "not FaultToleranceConfig fields" in r.message]
    assert len(records) == 1
    assert "did you mean 'rank_heartbeat_timeout'" in records[0].message
    assert "'max_rank_restarts' (a NeMo setting)" in records[0].message
    with pytest.raises(ValueError, match="did you mean 'rank_heartbeat_timeout'"):
        FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, rank_heartbeat_timout=3)


def test_every_nvrx_field_is_accepted_and_without_effect_ones_warn_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nvrx_07 = {
        "workload_check_interval": 5.0,
        "initial_rank_heartbeat_timeout": None,
        "rank_heartbeat_timeout": None,
        "rank_section_timeouts": {"setup": 600, "step": 180, "warmup": 900},
        "rank_out_of_section_timeout": 300,
        "node_health_check_interval": 5.0,
        "safety_factor": 5.0,
        "rank_termination_signal": "SIGKILL",
        "log_level": 20,
        "restart_check_interval": 30.0,
        "enable_nic_monitor": False,
        "enable_nic_healthcheck": True,
        "enable_dist_storage_healthcheck": False,
        "storage_healthcheck_path": None,
        "pci_topo_file": None,
        "link_down_path_template": "/sys/class/infiniband/{dev_name}/ports/1/counters/x",
        "link_state_path_template": None,
        "skip_section_response": True,
        "segment": None,
        "numa_bind_strict": True,
        "gpu_memory_reclaim_timeout": 50.0,
        "gpu_memory_tolerance_mb": 512.0,
        "gpu_memory_poll_interval": 2.0,
        "check_remaining_processes": False,
        "max_no_progress_cycles": 3,
        "min_progress_iterations": 1,
        "checkpoint_iteration_file": None,
        "install_exception_hook": False,
        "num_warmup_iterations": 5,
        "attribution_endpoint": None,
        "attribution_stop_action": None,
        "attribution_export_url": None,
        "cycle_info_dir": None,
        "segment_health_check_dir": None,
    }
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        cfg = FaultToleranceConfig.from_kwargs(ignore_not_recognized=False, **nvrx_07)
        FaultToleranceConfig(restart_check_interval=10.0)
    assert cfg.rank_termination_signal is signal.SIGKILL
    assert cfg.num_warmup_iterations == 5
    assert cfg.link_down_path_template == "/sys/class/infiniband/{nic}/ports/1/counters/x"
    without = [r.message for r in caplog.records if "accepted without effect" in r.message]
    given_without = {
        n for n in nvrx_07 if FaultToleranceConfig.field_spec(n).without_effect is not None
    }
    assert {m.split("=")[0].split(".")[1] for m in without} == given_without
    assert len(without) == len(given_without)  # once per field, not per config
    for name in FaultToleranceConfig.field_names():
        spec = FaultToleranceConfig.field_spec(name)
        assert spec.help
        if spec.without_effect is not None:
            assert len(spec.without_effect) > 20  # says why


@pytest.mark.parametrize("value", ["SIGKILL", "KILL", "kill", 9, "9", signal.SIGKILL])
def test_termination_signal_by_name_or_number(value: object) -> None:
    assert FaultToleranceConfig(rank_termination_signal=value).rank_termination_signal is (  # type: ignore[arg-type]
        signal.SIGKILL
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rank_heartbeat_timeout", 1e300),
        ("rank_termination_grace_period", 31 * 24 * 3600),
        ("workload_check_interval", "1e300"),
        ("rank_section_timeouts", {"step": float("inf")}),
        ("rank_section_timeouts", {"step": 10**400}),
        ("initial_rank_heartbeat_timeout", float("nan")),
        ("restart_check_interval", float("nan")),
        ("num_warmup_iterations", -1),
        ("num_warmup_iterations", 2.5),
        ("link_down_path_template", "/x/{nic}/{other}"),
        ("attribution_stop_action", "explode"),
    ],
)
def test_durations_are_bounded_and_finite(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        FaultToleranceConfig.from_kwargs(**{field: value})  # type: ignore[arg-type]
    assert FaultToleranceConfig(rank_heartbeat_timeout=MAX_DURATION_S).rank_heartbeat_timeout


def test_add_config_arguments_is_deprecated() -> None:
    parser = argparse.ArgumentParser()
    with pytest.warns(DeprecationWarning, match="add_ft_arguments"):
        add_config_arguments(parser)
    assert parser.parse_args(["--ft-segment", "4"]).ft_segment == "4"


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


def test_yaml_round_trip_says_nothing_about_nvrx_fields_left_at_default(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ft.yaml"
    FaultToleranceConfig(rank_heartbeat_timeout=9.0).to_yaml_file(path)
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        assert FaultToleranceConfig.from_yaml_file(path).rank_heartbeat_timeout == 9.0
    assert caplog.records == []
    cfg = FaultToleranceConfig(restart_check_interval=5.0)
    cfg.to_yaml_file(path)
    assert FaultToleranceConfig.from_yaml_file(path) == cfg


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


@pytest.mark.parametrize("text", ["", "# nothing\n", "trainer: {devices: 2}\n"])
def test_empty_file_plus_options_is_a_valid_config(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    args = _parser().parse_args(["--ft-cfg-path", str(path), "--ft-rank-heartbeat-timeout", "7"])
    cfg = FaultToleranceConfig.from_args(args)
    assert cfg == FaultToleranceConfig(rank_heartbeat_timeout=7.0)
    args = _parser().parse_args(["--ft-cfg-path", str(tmp_path / "missing.yaml")])
    with pytest.raises(FileNotFoundError):
        FaultToleranceConfig.from_args(args)


def test_nemo_job_yaml_loads_with_one_warning(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "nemo.yaml"
    path.write_text(
        "trainer:\n  devices: 8\nexp_manager:\n  create_fault_tolerance_callback: true\n"
        "  fault_tolerance:\n    calculate_timeouts: true\n    max_rank_restarts: 0\n"
        "    max_subsequent_job_failures: 3\n    additional_ft_launcher_args: ''\n"
        "    simulated_fault: null\n    rank_heartbeat_timeout: 60\n"
    )
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_heartbeat_timeout == 60.0
    (record,) = [r for r in caplog.records if "not FaultToleranceConfig fields" in r.message]
    for key in ("calculate_timeouts", "max_subsequent_job_failures", "simulated_fault"):
        assert key in record.message
    # Read again (as ft_launcher's two parses do): the same unknown keys are not repeated.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        FaultToleranceConfig.from_yaml_file(path)
    assert not [r for r in caplog.records if "not FaultToleranceConfig fields" in r.message]
    with pytest.raises(ValueError, match=r"nemo\.yaml.*calculate_timeouts"):
        FaultToleranceConfig.from_yaml_file(path, ignore_not_recognized=False)


@pytest.mark.parametrize(
    "text",
    [
        "a: &x [*x]\nfault_tolerance: {safety_factor: 2}\n",
        "a: &a [1, 1]\nb: &b [*a, *a]\nfault_tolerance: {safety_factor: 2}\n",
        "fault_tolerance: &d {safety_factor: 2}\nother: *d\n",
    ],
)
def test_yaml_aliases_are_refused_naming_the_file(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "alias.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="aliases") as info:
        FaultToleranceConfig.from_yaml_file(path)
    assert str(path) in str(info.value)


def test_deeply_nested_yaml_is_a_value_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=str(path)):
        FaultToleranceConfig.from_yaml_file(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_ft_arguments(parser)
    return parser


def test_every_field_has_an_option_with_none_default() -> None:
    args = _parser().parse_args([])
    for name in FaultToleranceConfig.cli_field_names():
        assert getattr(args, f"ft_{name}") is None
    # ft_launcher has its own options for NVRx's progress rule; these fields have none.
    no_cli = set(FaultToleranceConfig.field_names()) - set(FaultToleranceConfig.cli_field_names())
    assert no_cli == {
        "max_no_progress_cycles",
        "min_progress_iterations",
        "checkpoint_iteration_file",
    }
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


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("rank_hearbeat_timeout", "rank_heartbeat_timeout"),  # one deletion
        ("rank_heartbaet_timeout", "rank_heartbeat_timeout"),  # one swap
        ("workload_check_intreval", "workload_check_interval"),
        ("log_levle", "log_level"),
    ],
)
def test_misspelt_yaml_key_is_an_error_naming_both_spellings(
    tmp_path: pathlib.Path, key: str, field: str
) -> None:
    path = tmp_path / "ft.yaml"
    path.write_text(f"fault_tolerance:\n  {key}: 10\n  calculate_timeouts: true\n")
    with pytest.raises(ValueError, match="misspelt") as info:
        FaultToleranceConfig.from_yaml_file(path)
    message = str(info.value)
    assert str(path) in message
    assert repr(key) in message
    assert repr(field) in message
    assert "calculate_timeouts" not in message  # NeMo's key: not a typo


def test_keys_that_are_not_ours_stay_one_warning(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ft.yaml"
    # NeMo's initial_rank_heartbeat_timeout_s is two edits from a field, and is NeMo's.
    path.write_text(
        "fault_tolerance:\n  initial_rank_heartbeat_timeout_s: 3\n  my_team_setting: 1\n"
        "  rank_heartbeat_timeout: 60\n"
    )
    with caplog.at_level(logging.WARNING, logger="nvrx.ft.config"):
        cfg = FaultToleranceConfig.from_yaml_file(path)
    assert cfg.rank_heartbeat_timeout == 60.0
    (record,) = [r for r in caplog.records if "not FaultToleranceConfig fields" in r.message]
    assert "my_team_setting" in record.message
