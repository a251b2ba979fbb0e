"""Real CUPTI records from real kernels (needs a GPU and cupti-python: ``nox -s gpu_tests``)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nvrx.straggler import Statistic, StragglerDetector
from nvrx.straggler._cupti_timer import CuptiKernelTimer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        importlib.util.find_spec("cupti") is None, reason="needs cupti-python (the cupti extra)"
    ),
]


def test_real_kernels_reach_the_report_through_cupti() -> None:
    det = StragglerDetector(cuda_event_timing=True)
    try:
        assert isinstance(det.kernel_timer, CuptiKernelTimer), det.kernel_timer.status
        a = torch.randn(512, 512, device="cuda")
        torch.cuda.synchronize()
        outside = a @ a  # launched outside any section: must not be recorded
        for _ in range(5):
            with det.detection_section("matmul"):
                b = a @ a
        torch.cuda.synchronize()
        del outside, b
        report = det.generate_report()
        assert report is not None
        assert report.kernel_timing is not None
        assert report.kernel_timing.available, report.kernel_timing.reason
        assert report.local_kernel_summaries, "no CUPTI kernel records arrived"
        calls = sum(s[Statistic.NUM] for s in report.local_kernel_summaries.values())
        assert calls >= 5  # cuBLAS may use more than one kernel per matmul
        assert all(s[Statistic.MED] > 0 for s in report.local_kernel_summaries.values())
        assert report.gpu_relative_perf_scores == {0: 1.0}
        assert "matmul [cuda]" in report.local_section_summaries
    finally:
        det.close()


def test_sections_keep_working_while_torch_profiler_holds_cupti() -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]):
        det = StragglerDetector()
        try:
            a = torch.randn(64, 64, device="cuda")
            for _ in range(3):
                with det.detection_section("step"):
                    a = a @ a
            report = det.generate_report()
            assert report is not None
            assert report.section_relative_perf_scores["step"] == {0: 1.0}
            status = report.kernel_timing
            assert status is not None
            if not status.available:
                assert "CUPTI" in (status.reason or "")
        finally:
            det.close()
