"""Both implementations of the per-entry path behind the detectors' APIs.

The rest of the suite runs once with each (``nox -s tests``); the definition and its
C accelerator are compared entry by entry, without torch, in test_hotpath_parity.py.
These tests cover the detector-level wiring: dispatch, lifecycle, collection, exit.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from types import ModuleType

import pytest

from nvrx.straggler import (
    Detector,
    StragglerDetector,
    SyntheticKernelRecord,
    SyntheticKernelTimer,
    sections,
)

BUILT = importlib.util.find_spec("nvrx.straggler._hotpath") is not None
needs_c = pytest.mark.skipif(not BUILT, reason="the C extension is not built here")


def _hotpath() -> ModuleType:
    from nvrx.straggler import _hotpath

    return _hotpath


@pytest.fixture(params=["c", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Detectors created in the test use this implementation."""
    name: str = request.param
    if name == "c":
        if not BUILT:
            pytest.skip("the C extension is not built here")
        monkeypatch.setattr(sections, "hotpath", _hotpath())
    else:
        monkeypatch.setattr(sections, "hotpath", None)
    return name


@pytest.fixture
def detector(implementation: str) -> Iterator[StragglerDetector]:
    det = StragglerDetector(profiling_interval=3, kernel_timer=SyntheticKernelTimer())
    assert det._sections.implementation == implementation
    yield det
    det.close()


def _script(det: StragglerDetector, timer: SyntheticKernelTimer) -> dict[str, tuple[int, int]]:
    """Entries of every shape; (total entries, samples) per section."""

    def nested(depth: int) -> None:
        with det.detection_section("nested", profile_cuda=False):
            if depth:
                nested(depth - 1)

    def failing() -> None:
        with det.detection_section("failing", profile_cuda=False):
            raise KeyError("not timed")

    for i in range(10):
        with det.detection_section("kernels"):
            timer.feed([SyntheticKernelRecord("k", 0, 5)])
        with det.detection_section(profile_cuda=False):
            pass
        with det.detection_section(name="kw", profile_cuda=0):  # type: ignore[arg-type]
            pass
        if i % 4 == 0:
            with det.detection_section("kw", profile_cuda=False):  # a second location
                pass
        nested(i % 3)
        with pytest.raises(KeyError):
            failing()
    return {
        name: (s.total_entry_cnt, len(s.cpu_elapsed_times))
        for name, s in det.custom_sections.items()
    }


@needs_c
def test_both_implementations_count_and_sample_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    results = {}
    kernel_counts = {}
    for name, module in (("c", _hotpath()), ("python", None)):
        monkeypatch.setattr(sections, "hotpath", module)
        timer = SyntheticKernelTimer()
        with StragglerDetector(profiling_interval=3, kernel_timer=timer) as det:
            assert det._sections.implementation == name
            results[name] = _script(det, timer)
            kernel_counts[name] = (timer.start_calls, timer.active, timer.collect().counts)
    assert results["c"] == results["python"]
    assert kernel_counts["c"] == kernel_counts["python"]
    by_name = results["c"]
    assert by_name["kernels"] == (10, 4)  # entries 0, 3, 6, 9
    assert by_name["kw"] == (13, 5)  # both locations record into it
    assert by_name["failing"] == (10, 0)  # entries that raised are not timed
    # Depths 0,1,2,0,...: 19 entries; outermost ones at counts 0,1,3,6,7,9,12,13,15,18,
    # of which those divisible by 3 are sampled.
    assert by_name["nested"] == (19, 7)
    (anonymous,) = [n for n in by_name if n.startswith(__file__)]
    assert by_name[anonymous] == (10, 4)
    assert kernel_counts["c"][:2] == (4, False)


def test_a_closed_detector_refuses_every_section(detector: StragglerDetector) -> None:
    def enter(name: str | None) -> None:
        with detector.detection_section(name, profile_cuda=False):
            pass

    enter("named")
    enter(None)
    detector.close()
    for name in ("named", None, "new"):
        with pytest.raises(RuntimeError, match="not initialized"):
            enter(name)


def test_class_api_follows_initialize_and_shutdown(implementation: str) -> None:
    Detector.initialize(kernel_timer=SyntheticKernelTimer(), profiling_interval=1)
    section = Detector.detection_section
    assert isinstance(section, _hotpath().Dispatcher) == (implementation == "c")
    for _ in range(3):
        with Detector.detection_section("x", profile_cuda=False):
            pass
    assert Detector.custom_sections["x"].total_entry_cnt == 3
    Detector.shutdown()
    assert isinstance(vars(Detector)["detection_section"], classmethod)
    with pytest.raises(RuntimeError, match="not initialized"):
        Detector.detection_section("x", profile_cuda=False)
    with pytest.raises(RuntimeError, match="not initialized"):
        section("x", profile_cuda=False)  # a reference kept from before the shutdown


def test_a_closed_detector_is_garbage_collected(implementation: str) -> None:
    det = StragglerDetector(kernel_timer=SyntheticKernelTimer())
    with det.detection_section("s", profile_cuda=False):
        pass
    det.close()
    ref = weakref.ref(det)
    del det
    gc.collect()
    assert ref() is None


_LEFT_OPEN = """
from nvrx.straggler import Detector, StragglerDetector, SyntheticKernelTimer
Detector.initialize(kernel_timer=SyntheticKernelTimer())
other = StragglerDetector(kernel_timer=SyntheticKernelTimer())
for det in (Detector, other):
    for _ in range(3):
        with det.detection_section("named", profile_cuda=False):
            pass
        with det.detection_section("kernels"):
            pass
        with det.detection_section(profile_cuda=False):
            pass
"""


def test_the_interpreter_exits_cleanly_with_detectors_left_open(implementation: str) -> None:
    # Handles, their bound methods and dispatchers are then freed by the final collection.
    env = {k: v for k, v in os.environ.items() if k != "NVRX_STRAGGLER_PURE_PYTHON"}
    if implementation == "python":
        env["NVRX_STRAGGLER_PURE_PYTHON"] = "1"
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _LEFT_OPEN],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
