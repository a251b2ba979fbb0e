"""The report interval: estimated from step times, re-estimated at every report."""

from __future__ import annotations

import itertools

import pytest

from nvrx.straggler import ReportIntervalTracker, StragglerDetector, SyntheticKernelTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_interval_is_estimated_then_follows_step_time() -> None:
    clock = FakeClock()
    agreed: list[float] = []

    def agree(v: float) -> float:
        agreed.append(v)
        return v

    tracker = ReportIntervalTracker(time_interval=1.0, agree=agree, clock=clock)
    reports = []
    step = 0.01
    for it in range(1, 400):
        clock.now += step
        tracker.iter_increase()
        if tracker.is_interval_elapsed():
            reports.append(it)
            tracker.apply_agreed_interval(tracker.propose_interval())
        if it == 150:
            step = 0.05  # the job slows down: fewer iterations per second
    # first estimate after 16 step times (17 calls): 1 s / 10 ms = 100 iterations
    assert agreed == [pytest.approx(100.0)]
    assert reports[0] == 117
    # the report after the slowdown re-estimates to 1 s / 50 ms = 20 iterations
    gaps = [b - a for a, b in itertools.pairwise(reports)]
    assert gaps[0] == 100
    assert gaps[-1] == 20


def test_interval_is_never_below_profiling_interval_and_never_zero() -> None:
    clock = FakeClock()
    tracker = ReportIntervalTracker(time_interval=0.0, profiling_interval=7, clock=clock)
    for _ in range(17):
        clock.now += 0.5
        tracker.iter_increase()
    assert tracker.iter_interval == 7
    zero = ReportIntervalTracker(time_interval=10.0, clock=FakeClock())
    for _ in range(17):
        zero.iter_increase()  # clock never moves: zero step time
    assert zero.iter_interval is not None
    assert zero.iter_interval >= 1


def test_bad_interval_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match="report_time_interval"):
        ReportIntervalTracker(time_interval=-1.0)
    with pytest.raises(ValueError, match="profiling_interval"):
        StragglerDetector(profiling_interval=0, kernel_timer=SyntheticKernelTimer())


def test_generate_report_if_interval_elapsed_reports_on_the_interval() -> None:
    det = StragglerDetector(report_time_interval=0.0, kernel_timer=SyntheticKernelTimer())
    got = []
    for it in range(1, 21):
        with det.detection_section("s", profile_cuda=False):
            pass
        report = det.generate_report_if_interval_elapsed()
        assert (report is not None) == det.is_interval_elapsed()
        if report is not None:
            got.append(it)
    # the interval (1 iteration) is agreed at call 17; the first report is one interval later
    assert got == [18, 19, 20]
    det.close()
