"""The class-method API on one process: sections, reports, lifecycle."""

from __future__ import annotations

import time

import pytest

from nvrx.straggler import (
    CustomSection,
    Detector,
    Report,
    Statistic,
    StragglerDetector,
    SyntheticKernelRecord,
    SyntheticKernelTimer,
)


def test_not_initialized_is_a_clear_error() -> None:
    # NVRx's words first (users match them), then what to do.
    says = r"^Detector is not initialized\. Call Detector\.initialize\(\.\.\.\) first"
    with pytest.raises(RuntimeError, match=says):
        Detector.detection_section("x")
    with pytest.raises(RuntimeError, match=says):
        Detector.generate_report()
    with pytest.raises(RuntimeError, match="should not be instantiated"):
        Detector()


def test_world_size_one_report_with_sections_and_kernels() -> None:
    timer = SyntheticKernelTimer()
    Detector.initialize(kernel_timer=timer, node_name="here")
    for _ in range(5):
        with Detector.detection_section("work", profile_cuda=True):
            time.sleep(0.002)
            timer.feed([SyntheticKernelRecord("gemm", 1_000, 51_000)])
        with Detector.detection_section("cpu_only", profile_cuda=False):
            timer.feed([SyntheticKernelRecord("ignored", 1_000, 2_000)])
    report = Detector.generate_report()
    assert isinstance(report, Report)
    assert report.rank == 0
    assert report.rank_to_node == {0: "here"}
    assert report.gpu_relative_perf_scores == {0: 1.0}
    assert report.gpu_individual_perf_scores == {0: 1.0}
    assert report.section_relative_perf_scores == {"work": {0: 1.0}, "cpu_only": {0: 1.0}}
    work = report.local_section_summaries["work"]
    assert work[Statistic.NUM] == 5
    assert work[Statistic.MIN] >= 2.0  # milliseconds
    kernel = report.local_kernel_summaries["gemm_blk_1_1_1_grid_1_1_1"]
    assert kernel[Statistic.MED] == pytest.approx(50.0)  # microseconds
    assert kernel[Statistic.NUM] == 5
    assert "ignored_blk_1_1_1_grid_1_1_1" not in report.local_kernel_summaries
    section = Detector.custom_sections["work"]
    assert isinstance(section, CustomSection)
    assert section.total_entry_cnt == 5
    assert len(section.cpu_elapsed_times) == 0  # the window was reset by the report
    assert report.non_comparable == ()
    assert "work" in report.format_table()


def test_instances_are_independent_and_closable() -> None:
    a = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    b = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    with a.detection_section("s", profile_cuda=False):
        pass
    assert "s" in a.custom_sections
    assert "s" not in b.custom_sections
    a.close()
    a.close()
    with pytest.raises(RuntimeError, match="not initialized"):
        a.detection_section("s", profile_cuda=False)
    with b.detection_section("s", profile_cuda=False):
        pass
    b.close()
