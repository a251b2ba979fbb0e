"""NVRx's Detector class API: every class attribute reads the current instance.

Issue 16.2: nothing is mirrored into class variables, so after ``shutdown()`` no class
attribute refers to a closed detector, and the documented attributes read correctly
before, during and after a detector's life. Also the seeds' import path.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from nvrx.straggler import (
    CallableId,
    Detector,
    ReportGenerator,
    ReportIntervalTracker,
    StragglerDetector,
    SyntheticKernelTimer,
)

ATTRIBUTES = (
    "initialized",
    "scores_to_compute",
    "gather_on_rank0",
    "profiling_interval",
    "report_time_interval",
    "custom_sections",
    "reporter",
    "report_interval_tracker",
    "original_callables",
    "cupti_manager",
)
CLOSED = {
    "initialized": False,
    "scores_to_compute": [],
    "gather_on_rank0": True,
    "profiling_interval": 1,
    "report_time_interval": 60.0,
    "custom_sections": {},
    "reporter": None,
    "report_interval_tracker": None,
    "original_callables": {},
    "cupti_manager": None,
}


class _Model:
    def step(self) -> int:
        return 1


def _read() -> dict[str, Any]:
    return {name: getattr(Detector, name) for name in ATTRIBUTES}


def test_attributes_read_the_current_instance_before_during_and_after() -> None:
    assert _read() == CLOSED
    timer = SyntheticKernelTimer()
    inst = Detector.initialize(
        "individual_perf_scores",
        gather_on_rank0=False,
        profiling_interval=4,
        report_time_interval=30,
        kernel_timer=timer,
    )
    Detector.wrap_callables([CallableId(_Model, "step")], profile_cuda=False)
    with Detector.detection_section("s", profile_cuda=False):
        pass
    live = _read()
    assert live["initialized"] is True
    assert live["scores_to_compute"] == ["individual_perf_scores"]
    assert (live["gather_on_rank0"], live["profiling_interval"]) == (False, 4)
    assert live["report_time_interval"] == 30.0
    assert set(live["custom_sections"]) == {"s"}
    assert live["custom_sections"] is inst.custom_sections
    assert isinstance(live["reporter"], ReportGenerator)
    assert live["reporter"] is inst.reporter
    assert isinstance(live["report_interval_tracker"], ReportIntervalTracker)
    assert list(live["original_callables"]) == [CallableId(_Model, "step")]
    assert live["cupti_manager"] is timer
    _Model().step()
    assert Detector.custom_sections[str(CallableId(_Model, "step"))].total_entry_cnt == 1

    Detector.shutdown()
    assert _read() == CLOSED
    assert inst.closed
    assert vars(_Model)["step"] is _Model.__dict__["step"]  # restored
    ref = weakref.ref(inst)
    del inst, live
    gc.collect()
    assert ref() is None, "a class attribute still refers to the closed detector"


def test_use_serves_another_instance_and_refuses_a_closed_one() -> None:
    a = StragglerDetector(kernel_timer=SyntheticKernelTimer(), profiling_interval=2)
    b = StragglerDetector(kernel_timer=SyntheticKernelTimer(), profiling_interval=3)
    Detector.use(a)
    assert Detector.profiling_interval == 2
    Detector.use(b)
    assert a.closed
    assert Detector.profiling_interval == 3
    assert Detector.instance() is b
    with pytest.raises(ValueError, match="closed"):
        Detector.use(a)
    Detector.shutdown()


def test_the_seeds_module_path_exists() -> None:
    from nvrx.straggler import straggler

    assert straggler.Detector is Detector
    assert straggler.CallableId is CallableId
    assert straggler.CustomSection.__name__ == "CustomSection"
