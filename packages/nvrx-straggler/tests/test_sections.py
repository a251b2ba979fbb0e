"""Section timing: sampling, names and locations, nesting, exceptions."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from nvrx.straggler import Detector, StragglerDetector, SyntheticKernelRecord, SyntheticKernelTimer


def test_profiling_interval_measures_every_nth_entry() -> None:
    timer = SyntheticKernelTimer()
    det = StragglerDetector(profiling_interval=3, kernel_timer=timer)
    for _ in range(7):
        with det.detection_section("s"):
            timer.feed([SyntheticKernelRecord("k", 10, 20)])
    section = det.custom_sections["s"]
    assert section.total_entry_cnt == 7
    assert len(section.cpu_elapsed_times) == 3  # entries 0, 3, 6
    assert timer.start_calls == 3  # kernels are captured only in measured entries
    window = timer.collect()
    assert window.counts == {"k_blk_1_1_1_grid_1_1_1": 3}
    det.close()


def test_default_name_is_the_callers_file_and_line() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    for _ in range(2):
        with det.detection_section(profile_cuda=False):
            pass
    (name,) = det.custom_sections
    assert name.startswith(__file__ + ":")
    assert det.custom_sections[name].total_entry_cnt == 2
    det.close()


def test_name_reused_at_another_location_records_into_it_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # NVRx records both locations into one section; so do we, and say so once (issue 12.8).
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    with det.detection_section("step", profile_cuda=False):
        pass
    first = det.custom_sections["step"].location
    with caplog.at_level(logging.WARNING, logger="nvrx.straggler"):
        for _ in range(3):
            with det.detection_section("step", profile_cuda=False):
                pass
            with det.detection_section("step", profile_cuda=True):
                pass
    section = det.custom_sections["step"]
    assert (section.total_entry_cnt, len(section.cpu_elapsed_times)) == (7, 7)
    assert section.location == first
    warnings = [r.getMessage() for r in caplog.records if "'step'" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"is used at {first} and again at {__file__}:" in warnings[0]
    det.close()


def test_same_location_from_a_helper_is_fine() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())

    def timed(name: str) -> None:
        with det.detection_section(name, profile_cuda=False):
            pass

    for _ in range(3):
        timed("a")
        timed("b")
    assert det.custom_sections["a"].total_entry_cnt == 3
    det.close()


def test_nested_entries_time_the_outermost_and_exceptions_are_not_timed() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())

    def recurse(n: int) -> None:
        with det.detection_section("r", profile_cuda=False):
            if n:
                recurse(n - 1)

    recurse(3)
    section = det.custom_sections["r"]
    assert section.total_entry_cnt == 4
    assert len(section.cpu_elapsed_times) == 1

    def fails() -> None:
        with det.detection_section("f", profile_cuda=False):
            raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    assert det.custom_sections["f"].total_entry_cnt == 1
    assert len(det.custom_sections["f"].cpu_elapsed_times) == 0
    fails_again = det.custom_sections["f"]
    with pytest.raises(KeyError):
        fails()
    assert fails_again.total_entry_cnt == 2
    det.close()


def test_sample_buffer_is_bounded_and_num_counts_every_measurement() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer(), max_samples_per_section=4)
    for _ in range(10):
        with det.detection_section("s", profile_cuda=False):
            pass
    assert len(det.custom_sections["s"].cpu_elapsed_times) == 4
    report = det.generate_report()
    assert report is not None
    from nvrx.straggler import Statistic

    assert report.local_section_summaries["s"][Statistic.NUM] == 10
    det.close()


def test_bad_name_is_a_clear_error() -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        det.detection_section("")
    det.close()


def test_class_api_sections() -> None:
    Detector.initialize(kernel_timer=SyntheticKernelTimer(), profiling_interval=2)
    for _ in range(4):
        with Detector.detection_section("x", profile_cuda=False):
            pass
    assert Detector.custom_sections["x"].total_entry_cnt == 4
    assert len(Detector.custom_sections["x"].cpu_elapsed_times) == 2


class FakeEvent:
    """Stands in for torch.cuda.Event on CPU: records host time."""

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t = 0.0

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1000.0


def test_cuda_event_timing_adds_a_gpu_time_section(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import torch

    from nvrx.straggler.sections import SectionRegistry
    from nvrx.straggler.statistics import Statistic

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    registry = SectionRegistry(1, None, cuda_event_timing=True)

    def enter(name: str, cuda: bool) -> Any:
        import sys

        return registry.enter(name, cuda, sys._getframe(1))

    def work(depth: int, fail: bool = False) -> None:
        with enter("fwd", True):  # nested entries: one event pair for the outermost
            if depth:
                work(depth - 1, fail)
            elif fail:
                raise KeyError("not timed")
            else:
                time.sleep(0.001)

    for _ in range(4):
        work(1)
        with enter("cpu", False):
            pass
    with pytest.raises(KeyError):
        work(0, fail=True)
    summaries = registry.summaries()
    assert summaries["fwd [cuda]"][Statistic.NUM] == 4  # outer entries only, no failed one
    assert summaries["fwd [cuda]"][Statistic.MIN] >= 1.0
    assert summaries["fwd"][Statistic.NUM] == 4
    assert "cpu [cuda]" not in summaries
    registry.reset_window()
    assert "fwd [cuda]" not in registry.summaries()
