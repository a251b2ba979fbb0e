"""The NeMo-style configs of the Lightning guide build the callbacks as documented."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from nvrx.ft import WorkloadAction, WorkloadControlRequest
from nvrx.ptl import (
    FaultToleranceCallback,
    FaultToleranceSectionsCallback,
    SimulatedFaultParams,
    StragglerDetectionCallback,
)

YAML = """
callbacks:
  fault_tolerance:
    autoresume: true
    calculate_timeouts: true
    exp_dir: /shared/run42/ft
    simulated_fault_params: {fault_type: rank_hung, base_delay: 600, rand_delay: 300}
  fault_tolerance_sections:
    autoresume: true
    calculate_timeouts: true
    exp_dir: /shared/run42/ft
  straggler_detection:
    report_time_interval: 300
    calc_relative_gpu_perf: true
    calc_individual_gpu_perf: true
    num_gpu_perf_scores_to_print: 5
    gpu_relative_perf_threshold: 0.7
    gpu_individual_perf_threshold: 0.7
    stop_if_detected: false
    enable_ptl_logging: true
"""


def _policy(exc: BaseException) -> WorkloadControlRequest:
    return WorkloadControlRequest(WorkloadAction.Continue, repr(exc))


def test_callbacks_from_a_dictconfig() -> None:
    cfg = OmegaConf.create(YAML)
    ft = FaultToleranceCallback(**cfg.callbacks.fault_tolerance)
    assert ft.autoresume is True
    assert ft.exp_dir == Path("/shared/run42/ft")
    assert ft.simulated_fault_params == SimulatedFaultParams("rank_hung", 600.0, 300.0, None)
    sections = FaultToleranceSectionsCallback(
        **cfg.callbacks.fault_tolerance_sections, exc_handling_policy=_policy
    )
    assert sections.calculate_timeouts is True
    straggler = StragglerDetectionCallback(**cfg.callbacks.straggler_detection)
    assert straggler.scores_to_compute == ["relative_perf_scores", "individual_perf_scores"]
    assert straggler.report_time_interval == 300.0


def test_callbacks_from_plain_dicts() -> None:
    cfg = OmegaConf.to_container(OmegaConf.create(YAML))
    assert isinstance(cfg, dict)
    ft = FaultToleranceCallback(**cfg["callbacks"]["fault_tolerance"])
    assert ft.simulated_fault_params is not None
    assert ft.simulated_fault_params.fault_type == "rank_hung"
    assert (
        StragglerDetectionCallback(**cfg["callbacks"]["straggler_detection"]).stop_if_detected
        is False
    )
