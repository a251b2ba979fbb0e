"""CUDA-event section timing on a real GPU (``nox -s gpu_tests``; needs no cupti-python)."""

from __future__ import annotations

import pytest
import torch

from nvrx.straggler import Statistic, StragglerDetector
from nvrx.straggler._kernels import SyntheticKernelTimer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_an_async_section_gets_its_gpu_time_beside_its_host_time() -> None:
    # CUPTI is left out (a synthetic timer), so only the CUDA events time the GPU.
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer(), cuda_event_timing=True)
    try:
        a = torch.randn(4096, 4096, device="cuda")
        a @ a
        torch.cuda.synchronize()
        for _ in range(10):
            with det.detection_section("async_matmul"):
                a @ a  # launched, not waited for
        with det.detection_section("host_only", profile_cuda=False):
            a @ a
        torch.cuda.synchronize()
        report = det.generate_report()
        assert report is not None
        summaries = report.local_section_summaries
        host = summaries["async_matmul"]
        gpu = summaries["async_matmul [cuda]"]
        assert gpu[Statistic.NUM] == 10
        # The host returns once the kernel is queued; the GPU runs it for much longer.
        assert gpu[Statistic.MED] > host[Statistic.MED]
        assert "host_only [cuda]" not in summaries  # profile_cuda=False: no events
    finally:
        det.close()


def test_a_report_waits_for_its_events_and_starts_a_new_window() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer(), cuda_event_timing=True)
    try:
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(3):
            with det.detection_section("step"):
                a @ a
        first = det.generate_report()  # no synchronize here: the report waits for the GPU
        assert first is not None
        assert first.local_section_summaries["step [cuda]"][Statistic.NUM] == 3
        second = det.generate_report()  # a new window: nothing left over from the last
        assert second is not None
        assert "step [cuda]" not in second.local_section_summaries
    finally:
        det.close()
