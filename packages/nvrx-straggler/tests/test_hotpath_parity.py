"""The per-entry path and window statistics: the Python definition and its C accelerator.

Runs without torch (``nox`` builds the extension and runs this file on every supported
CPython): only ``nvrx.straggler.sections``, ``.statistics`` and ``.kernels`` are
imported. The same scripted entries go through both implementations and everything
observable is compared; the rest covers what only one of them could get wrong.
"""

from __future__ import annotations

import collections
import gc
import importlib.util
import logging
import math
import os
import random
import statistics as stdlib_statistics
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from nvrx.straggler import sections, statistics
from nvrx.straggler._kernels import SyntheticKernelRecord, SyntheticKernelTimer
from nvrx.straggler.sections import CustomSection, EntryCounter, SectionRegistry

BUILT = importlib.util.find_spec("nvrx.straggler._hotpath") is not None
needs_c = pytest.mark.skipif(not BUILT, reason="the C extension is not built here")
Section = Callable[..., Any]


def _hotpath() -> ModuleType:
    from nvrx.straggler import _hotpath

    return _hotpath


def _module(implementation: str) -> ModuleType | None:
    if implementation == "python":
        return None
    if not BUILT:
        pytest.skip("the C extension is not built here")
    return _hotpath()


@pytest.fixture(params=["c", "python"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Registries created in the test use this implementation."""
    name: str = request.param
    monkeypatch.setattr(sections, "hotpath", _module(name))
    return name


def detection_section(registry: SectionRegistry) -> Section:
    """What a detector's ``detection_section`` is: the C dispatcher, else ``enter``."""
    fast = registry.dispatcher()
    if fast is not None:
        return fast

    def enter(name: str | None = None, profile_cuda: bool = True) -> Any:
        return registry.enter(name, profile_cuda, sys._getframe(1))

    return enter


@pytest.fixture
def registry(implementation: str) -> Iterator[SectionRegistry]:
    reg = SectionRegistry(3, SyntheticKernelTimer())
    assert reg.implementation == implementation
    yield reg
    reg.close()


def test_the_implementation_in_use_is_the_one_asked_for() -> None:
    if os.environ.get("NVRX_STRAGGLER_PURE_PYTHON", "") not in ("", "0"):
        assert sections.HOT_PATH == "python"
    elif os.environ.get("NVRX_REQUIRE_HOTPATH") == "1":
        assert sections.HOT_PATH == "c", "the C extension was not built"
    else:
        assert ("c" if BUILT else "python") == sections.HOT_PATH
    assert "torch" not in sys.modules or "nvrx.straggler._detector" in sys.modules


def _script(section: Section, timer: SyntheticKernelTimer) -> list[Any]:
    """Entries of every shape; returns what each step observed."""
    seen: list[Any] = []

    def nested(depth: int) -> None:
        with section("nested", profile_cuda=False):
            if depth:
                nested(depth - 1)

    def failing() -> None:
        with section("failing", profile_cuda=False):
            raise KeyError("not timed")

    def elsewhere() -> None:
        with section("kw", profile_cuda=False):  # the name again, at another line
            pass

    for i in range(10):
        handle = section("kernels")
        with handle:
            seen.append(("measuring", handle.measuring, timer.active))
            timer.feed([SyntheticKernelRecord("k", 1, 5 + i)])
        with section(profile_cuda=False):
            pass
        with section(name="kw", profile_cuda=0):
            pass
        if i % 4 == 0:
            elsewhere()
        nested(i % 3)
        with pytest.raises(KeyError):
            failing()
    markers = (
        "positional argument",
        "unhashable",
        "name must be a non-empty str, got 3",
        "unexpected keyword argument 'profile'",
        "multiple values for argument 'name'",
    )
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("a", False, 1), {}),
        ((["a"],), {}),
        ((3,), {}),
        (("a",), {"profile": False}),
        (("a",), {"name": "b"}),
    ]
    for args, kwargs in calls:
        try:
            section(*args, **kwargs)
        except (TypeError, ValueError) as e:  # what is raised, and why, is compared
            found = [m for m in markers if m in str(e)]
            seen.append((type(e).__name__, found[0] if found else str(e)))
    return seen


def _observe(implementation: str, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> Any:
    monkeypatch.setattr(sections, "hotpath", _module(implementation))
    timer = SyntheticKernelTimer()
    reg = SectionRegistry(3, timer)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nvrx.straggler"):
        seen = _script(detection_section(reg), timer)
    by_name = {
        name.replace(__file__, "<here>"): (
            s.total_entry_cnt,
            len(s.cpu_elapsed_times),
            s.location.replace(__file__, "<here>"),
            type(s.counter).__name__,
        )
        for name, s in reg.sections.items()
    }
    window = timer.collect()
    logged = [r.getMessage().replace(__file__, "<here>") for r in caplog.records]
    reg.close()
    return seen, by_name, (timer.start_calls, timer.active, window.counts), logged


@needs_c
def test_both_implementations_observe_the_same(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    c = _observe("c", monkeypatch, caplog)
    python = _observe("python", monkeypatch, caplog)
    assert c[0] == python[0]
    assert {k: v[:3] for k, v in c[1].items()} == {k: v[:3] for k, v in python[1].items()}
    assert c[2] == python[2]
    assert c[3] == python[3]
    assert {v[3] for v in c[1].values()} == {"Counter"}
    assert {v[3] for v in python[1].values()} == {"EntryCounter"}


def test_the_definition_counts_and_samples_so(
    implementation: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen, by_name, kernels, logged = _observe(implementation, monkeypatch, caplog)
    assert by_name["kernels"][:2] == (10, 4)  # entries 0, 3, 6, 9
    assert by_name["kw"][:2] == (13, 5)  # 10 + 3 from the second location, all recorded
    assert by_name["failing"][:2] == (10, 0)  # entries that raised are not timed
    # Depths 0,1,2,0,...: 19 entries; outermost ones at counts 0,1,3,6,7,9,12,13,15,18,
    # of which those divisible by 3 are sampled.
    assert by_name["nested"][:2] == (19, 7)
    (anonymous,) = [n for n in by_name if n.startswith("<here>:")]
    assert by_name[anonymous][:2] == (10, 4)
    assert kernels == (4, False, {"k_blk_1_1_1_grid_1_1_1": 4})
    assert [m for m in seen if m[0] == "measuring"] == [
        ("measuring", i % 3 == 0, i % 3 == 0) for i in range(10)
    ]
    assert [m for m in seen if m[0] != "measuring"] == [
        ("TypeError", "positional argument"),
        ("TypeError", "unhashable"),
        ("ValueError", "name must be a non-empty str, got 3"),
        ("TypeError", "unexpected keyword argument 'profile'"),
        ("TypeError", "multiple values for argument 'name'"),
    ]
    (reused,) = logged  # said once, however often the second location runs
    assert reused.startswith("detection_section: name 'kw' is used at <here>:")


def test_a_closed_registry_refuses_every_section(registry: SectionRegistry) -> None:
    section = detection_section(registry)

    def enter(name: str | None) -> None:
        with section(name, profile_cuda=False):
            pass

    enter("named")
    enter(None)
    registry.close()
    for name in ("named", None, "new"):
        with pytest.raises(RuntimeError, match="not initialized"):
            enter(name)


def test_sections_and_handles_are_garbage_collected(implementation: str) -> None:
    timer = SyntheticKernelTimer()
    reg = SectionRegistry(1, timer)
    section = detection_section(reg)
    with section("s"):
        pass
    with section(profile_cuda=False):
        pass
    ref = weakref.ref(timer)
    del reg, section, timer
    gc.collect()
    assert ref() is None


_LEFT_OPEN = """
import sys
from nvrx.straggler._kernels import SyntheticKernelTimer
from nvrx.straggler.sections import SectionRegistry
keep = []
for _ in range(2):
    reg = SectionRegistry(1, SyntheticKernelTimer())
    fast = reg.dispatcher()
    def section(name=None, profile_cuda=True, reg=reg):
        return reg.enter(name, profile_cuda, sys._getframe(1))
    section = fast or section
    for _ in range(3):
        with section("named", profile_cuda=False):
            pass
        with section("kernels"):
            pass
        with section(profile_cuda=False):
            pass
    keep.append((reg, section))
assert "torch" not in sys.modules
"""


def test_the_interpreter_exits_cleanly_with_registries_left_open(implementation: str) -> None:
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


class _FailingSamples:
    def append(self, value: float) -> None:
        raise OSError("sample store failed")


def _failing_kernel_handle(implementation: str, timer: SyntheticKernelTimer) -> Any:
    """A handle timing every entry with ``timer``, whose samples cannot be stored."""
    code = sys._getframe().f_code
    counter = EntryCounter() if implementation == "python" else _hotpath().Counter()
    section = CustomSection("f", "here", counter=counter)
    section.cpu_elapsed_times = _FailingSamples()  # type: ignore[assignment]
    if implementation == "c":
        return _hotpath().Handle(section, 1, code, 0, timer)
    return sections.SectionHandle(section, 1, code, 0, timer)


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


def test_identical_code_in_two_files_is_two_call_sites(
    registry: SectionRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    # The two functions' code objects compare equal: only the file tells them apart.
    section = detection_section(registry)
    anonymous = "def step(section):\n    with section(profile_cuda=False):\n        pass\n"
    a, b = _load(anonymous, "/models/a.py"), _load(anonymous, "/models/b.py")
    assert a.__code__ == b.__code__
    for _ in range(3):
        a(section)
    b(section)
    counts = {name: s.total_entry_cnt for name, s in registry.sections.items()}
    assert counts == {"/models/a.py:2": 3, "/models/b.py:2": 1}

    named = anonymous.replace("section(", "section('fwd', ", 1).replace(
        "with section(profile", "with section('fwd', profile"
    )
    a, b = _load(named, "/models/a.py"), _load(named, "/models/b.py")
    with caplog.at_level(logging.WARNING, logger="nvrx.straggler"):
        a(section)
        b(section)
        b(section)
    assert registry.sections["fwd"].total_entry_cnt == 3  # recorded together, as NVRx
    (message,) = [r.getMessage() for r in caplog.records]
    assert "'fwd' is used at /models/a.py:2 and again at /models/b.py:2" in message


def _reference_summary(samples: list[float], count: int) -> dict[statistics.Statistic, float]:
    """The summary's definition computed another way (sorted order, fsum, stdlib pstdev)."""
    ordered = sorted(samples)
    n = len(ordered)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {
        statistics.Statistic.MIN: ordered[0],
        statistics.Statistic.MAX: ordered[-1],
        statistics.Statistic.MED: median,
        statistics.Statistic.AVG: math.fsum(ordered) / n,
        statistics.Statistic.STD: stdlib_statistics.pstdev(ordered),
        statistics.Statistic.NUM: float(count),
    }


def test_summarize_agrees_with_its_definition(implementation: str) -> None:
    native = _module(implementation)
    rng = random.Random(7)
    for n in (1, 2, 3, 4, 7, 8, 100, 101, 8192):
        samples = [rng.lognormvariate(0.0, 0.3) for _ in range(n)]
        samples[rng.randrange(n)] = samples[0]  # ties
        want = _reference_summary(samples, n + 3)
        got = (
            statistics.summarize_python(samples, n + 3)
            if native is None
            else dict(zip(statistics.Statistic, native.summarize(samples, n + 3), strict=True))
        )
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), (n, key)
        assert got[statistics.Statistic.MED] == want[statistics.Statistic.MED]


@needs_c
def test_c_objects_refuse_misuse_instead_of_crashing() -> None:
    hotpath = _hotpath()
    handle_type: Any = hotpath.Handle
    with pytest.raises(TypeError, match="not initialised"):
        handle_type.__new__(handle_type).__enter__()
    with pytest.raises(TypeError, match="not initialised"):
        hotpath.Dispatcher.__new__(hotpath.Dispatcher)("x")
    code = sys._getframe().f_code
    python_counted = CustomSection("p", "here")  # an EntryCounter: not the C one
    with pytest.raises(TypeError, match=r"section\.counter must be a nvrx\.straggler\._hotpath"):
        handle_type(python_counted, 1, code, 0)
    section = CustomSection("c", "here", counter=hotpath.Counter())
    with pytest.raises(ValueError, match="interval must be >= 1, got 0"):
        handle_type(section, 0, code, 0)
    with pytest.raises(TypeError, match="code must be a code object"):
        handle_type(section, 1, "code", 0)
    handle = handle_type(section, 1, code, 0)
    with pytest.raises(TypeError, match="expected 3 arguments"):
        handle.__exit__(None)
    with pytest.raises(TypeError, match="code object or None"):
        handle.code = "code"
    handle.code = None
    assert handle.code is None
    section.total_entry_cnt = 2**63 - 1
    with pytest.raises(OverflowError):
        handle.__enter__()
    with pytest.raises(TypeError, match="must be an int, not str"):
        section.total_entry_cnt = "many"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=">= 0"):
        hotpath.Counter(-1)
    with pytest.raises(TypeError, match="plain dicts"):
        hotpath.Dispatcher(dict(), dict(), collections.OrderedDict(), print, print)
    with pytest.raises(TypeError, match="2 arguments"):
        hotpath.summarize([1.0])
    with pytest.raises(TypeError):
        hotpath.summarize(["x"], None)


def test_custom_section_keeps_nvrx_constructor() -> None:
    s = CustomSection("n", "f.py:1", 5, 4, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.name, s.location, s.total_entry_cnt, s.max_elapseds_len) == ("n", "f.py:1", 5, 4)
    assert list(s.cpu_elapsed_times) == [2.0, 3.0, 4.0, 5.0]
    s.total_entry_cnt += 1
    assert s.counter.value == 6
    assert "total_entry_cnt=6" in repr(s)
    with pytest.raises(ValueError, match="max_elapseds_len"):
        CustomSection("n", "f.py:1", max_elapseds_len=0)


_NO_COMPILER = """
import sys
sys.modules["nvrx.straggler._hotpath"] = None  # as an sdist installed without a compiler
from nvrx.straggler import sections, statistics
import nvrx.straggler._kernels
print("HOT_PATH", sections.HOT_PATH, statistics.summarize([1.0, 3.0])[statistics.Statistic.MED])
"""


def test_without_the_extension_the_python_path_runs_and_says_so_once() -> None:
    """Visible with no logging configured (a warning), once, saying what to do."""
    env = {k: v for k, v in os.environ.items() if k != "NVRX_STRAGGLER_PURE_PYTHON"}

    def run(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _NO_COMPILER],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )

    done = run({})
    assert "HOT_PATH python 2.0" in done.stdout
    said = [line for line in done.stderr.splitlines() if "is not built" in line]
    assert len(said) == 1, done.stderr
    assert "nox -s build" in said[0]
    assert "NVRX_STRAGGLER_PURE_PYTHON=1" in said[0]
    chosen = run({"NVRX_STRAGGLER_PURE_PYTHON": "1"})  # the user's choice: nothing to say
    assert "HOT_PATH python 2.0" in chosen.stdout
    assert "is not built" not in chosen.stderr
