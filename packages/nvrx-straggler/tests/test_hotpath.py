"""The two implementations of the per-entry path: the C extension and Python.

The rest of the suite runs once with each (``nox -s tests``); these tests compare
them directly in one process and cover what only one of them can get wrong.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import importlib.util
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from types import ModuleType
from typing import Any

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


def test_the_implementation_in_use_is_the_one_asked_for() -> None:
    if os.environ.get("NVRX_STRAGGLER_PURE_PYTHON", "") not in ("", "0"):
        assert sections.HOT_PATH == "python"
    elif os.environ.get("NVRX_REQUIRE_HOTPATH") == "1":
        assert sections.HOT_PATH == "c", "the C extension was not built"
    else:
        assert ("c" if BUILT else "python") == sections.HOT_PATH


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
    assert by_name["kw"] == (10, 4)
    assert by_name["failing"] == (10, 0)  # entries that raised are not timed
    # Depths 0,1,2,0,...: 19 entries; outermost ones at counts 0,1,3,6,7,9,12,13,15,18,
    # of which those divisible by 3 are sampled.
    assert by_name["nested"] == (19, 7)
    (anonymous,) = [n for n in by_name if n.startswith(__file__)]
    assert by_name[anonymous] == (10, 4)
    assert kernel_counts["c"][:2] == (4, False)


def test_arguments_are_checked_like_a_python_function(detector: StragglerDetector) -> None:
    section: Any = detector.detection_section
    with pytest.raises(TypeError, match="positional"):
        section("a", False, 1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'profile'"):
        section("a", profile=False)
    with pytest.raises(TypeError, match="multiple values for argument 'name'"):
        section("a", name="b")
    with pytest.raises(TypeError, match="unhashable"):
        section(["a"])
    with pytest.raises(ValueError, match="name must be a non-empty str"):
        section(3)


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
    # A C handle has a class of its own (see Handle_new in _hotpath.c); it goes too.
    handle_class = weakref.ref(type(det._sections.cpu_handles["s"]))
    det.close()
    ref = weakref.ref(det)
    del det
    gc.collect()
    assert ref() is None
    assert (handle_class() is None) == (implementation == "c")


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
    # Handles, their classes and dispatchers are then freed by the final collection.
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


@dataclasses.dataclass(slots=True)
class _FailingSamples:
    def append(self, value: float) -> None:
        raise OSError("sample store failed")


@dataclasses.dataclass(slots=True)
class _Section:
    total_entry_cnt: int = 0
    cpu_elapsed_times: Any = dataclasses.field(default_factory=_FailingSamples)


def _failing_kernel_handle(implementation: str, timer: SyntheticKernelTimer) -> Any:
    """A handle timing every entry with ``timer``, whose samples cannot be stored."""
    code = sys._getframe().f_code
    if implementation == "c":
        return _hotpath().Handle(_Section(), 1, code, 0, timer)
    return sections._KernelSectionHandle(_Section(), 1, code, 0, timer)  # type: ignore[arg-type]


def test_the_kernel_timer_is_stopped_even_if_the_sample_is_lost(implementation: str) -> None:
    timer = SyntheticKernelTimer()
    handle = _failing_kernel_handle(implementation, timer)
    handle.__enter__()
    assert timer.active
    with pytest.raises(OSError, match="sample store failed"):
        handle.__exit__(None, None, None)
    assert (timer.active, handle.measuring) == (False, False)


class _StopFails(SyntheticKernelTimer):
    def stop(self) -> None:
        super().stop()
        raise RuntimeError("stop failed")


def test_a_failing_stop_is_raised_with_the_lost_sample_as_context(implementation: str) -> None:
    handle = _failing_kernel_handle(implementation, _StopFails())
    handle.__enter__()
    with pytest.raises(RuntimeError, match="stop failed") as raised:
        handle.__exit__(None, None, None)
    assert isinstance(raised.value.__context__, OSError)


def _load(source: str, filename: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["step"]


def test_identical_code_in_two_files_is_two_call_sites(detector: StragglerDetector) -> None:
    # The two functions' code objects compare equal: only the file tells them apart.
    anonymous = (
        "def step(det):\n    with det.detection_section(profile_cuda=False):\n        pass\n"
    )
    a, b = _load(anonymous, "/models/a.py"), _load(anonymous, "/models/b.py")
    assert a.__code__ == b.__code__
    for _ in range(3):
        a(detector)
    b(detector)
    counts = {name: s.total_entry_cnt for name, s in detector.custom_sections.items()}
    assert counts == {"/models/a.py:2": 3, "/models/b.py:2": 1}

    named = anonymous.replace("detection_section(", "detection_section('fwd', ")
    a, b = _load(named, "/models/a.py"), _load(named, "/models/b.py")
    a(detector)
    with pytest.raises(ValueError, match=r"'fwd' is already used at /models/a\.py:2"):
        b(detector)


@needs_c
def test_c_objects_refuse_misuse_instead_of_crashing() -> None:
    hotpath = _hotpath()
    handle_type: Any = hotpath.Handle
    with pytest.raises(TypeError, match="not initialised"):
        handle_type.__new__(handle_type).__enter__()
    with pytest.raises(TypeError, match="not initialised"):
        hotpath.Dispatcher.__new__(hotpath.Dispatcher)("x")

    class Borrowed:
        # A slot descriptor of another class: writing through it would corrupt memory.
        __slots__ = ("cpu_elapsed_times",)
        total_entry_cnt = vars(_Section)["total_entry_cnt"]

        def __init__(self) -> None:
            self.cpu_elapsed_times: list[float] = []

    code = sys._getframe().f_code
    with pytest.raises(TypeError, match="must be a writable slot"):
        handle_type(Borrowed(), 1, code, 0)

    class Index:
        # Converting it would run Python code while the old value is borrowed.
        def __index__(self) -> int:
            section.total_entry_cnt = 0
            return 5

    section = _Section()
    handle = handle_type(section, 1, code, 0)
    section.total_entry_cnt = Index()  # type: ignore[assignment]
    with pytest.raises(TypeError, match="total_entry_cnt must be an int, not Index"):
        handle.__enter__()
    section.total_entry_cnt = 2**63 - 1
    with pytest.raises(OverflowError):
        handle.__enter__()
    with pytest.raises(TypeError, match="plain dicts"):
        hotpath.Dispatcher(dict(), dict(), collections.OrderedDict(), print, print)


@needs_c
def test_c_handle_rejects_what_it_cannot_time() -> None:
    code = sys._getframe().f_code
    handle_type: Any = _hotpath().Handle
    with pytest.raises(ValueError, match="interval must be >= 1, got 0"):
        handle_type(_Section(), 0, code, 0)

    class Plain:
        def __init__(self) -> None:
            self.total_entry_cnt = 0
            self.cpu_elapsed_times: list[float] = []

    with pytest.raises(TypeError, match=r"Plain\.total_entry_cnt must be a writable slot"):
        handle_type(Plain(), 1, code, 0)
    section = _Section()
    handle = handle_type(section, 1, code, 0)
    section.total_entry_cnt = "many"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="must be an int, not str"):
        handle.__enter__()
    with pytest.raises(TypeError, match="code must be a code object"):
        handle_type(_Section(), 1, "code", 0)
    with pytest.raises(TypeError, match="expected 3 arguments"):
        handle.__exit__(None)
