"""The CUPTI kernel timer, driven by a stand-in for ``cupti.cupti`` on CPU.

The stand-in has the cupti-python calls the timer uses, with the signatures of
cupti-python 13.4's ``cupti/cupti.pyi`` (output parameters are addresses, as there),
and delivers activity records the way cupti-python does: decoded objects passed to
the buffer-completed callback when buffers are flushed.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import inspect
import sys
from typing import Any

import pytest

from nvrx.straggler import Statistic, StragglerDetector
from nvrx.straggler._cupti_timer import CuptiKernelTimer, cuda_major_mismatch, make_kernel_timer


class ActivityKind(enum.IntEnum):
    MEMCPY = 1
    CONCURRENT_KERNEL = 10


class Activity:
    def __init__(self, kind: int, name: str, start: int, end: int, grid: int = 1) -> None:
        self.kind = kind
        self.name = name
        self.start = start
        self.end = end
        self.grid_x, self.grid_y, self.grid_z = grid, 1, 1
        self.block_x, self.block_y, self.block_z = 128, 1, 1


class FakeCupti:
    ActivityKind = ActivityKind

    def __init__(
        self, *, busy: bool = False, enable_fails: bool = False, subscribed: bool = False
    ) -> None:
        self.busy = busy
        self.subscribed = subscribed
        self.unsubscribed = 0
        self.enable_fails = enable_fails
        self.enabled = False
        self.toggles = 0
        self.pending: list[Activity] = []
        self.dropped = 0
        self.completed: Any = None
        self.finalized = False

    def subscribe(self, callback: Any, userdata: Any) -> int:
        if self.subscribed:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        return 42

    def unsubscribe(self, handle: int) -> None:
        assert handle == 42
        self.unsubscribed += 1

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        if self.busy:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        assert requested() == (8 * 1024 * 1024, 0)
        self.completed = completed

    def activity_enable(self, kind: int) -> None:
        if self.enable_fails:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        assert kind == ActivityKind.CONCURRENT_KERNEL
        self.enabled = True
        self.toggles += 1

    def is_enabled(self) -> bool:
        return self.enabled

    def activity_disable(self, kind: int) -> None:
        self.enabled = False

    def launch(self, activity: Activity) -> None:
        if self.enabled:
            self.pending.append(activity)

    def activity_flush_all(self, flag: int) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.completed(batch)

    def activity_get_num_dropped_records(self, context: int, stream_id: int, dropped: int) -> None:
        assert context == 0  # the global queue
        ctypes.c_size_t.from_address(dropped).value = self.dropped
        self.dropped = 0

    def finalize(self) -> None:
        self.finalized = True


K = int(ActivityKind.CONCURRENT_KERNEL)


def test_kernel_records_flow_from_cupti_callbacks_into_scores() -> None:
    fake = FakeCupti()
    timer = make_kernel_timer(cupti_module=fake)
    assert isinstance(timer, CuptiKernelTimer)
    det = StragglerDetector(kernel_timer=timer)
    fake.launch(Activity(K, "outside", 1, 2))  # not in a profiled section: not captured
    for i in range(4):
        with det.detection_section("fwd"):
            assert fake.is_enabled()
            with det.detection_section("inner"):  # nested: still one enable
                fake.launch(Activity(K, "gemm", 1_000, 11_000 + 1_000 * i))
            fake.launch(Activity(K, "gemm", 0, 5))  # no timestamps: skipped, counted
            fake.launch(Activity(int(ActivityKind.MEMCPY), "copy", 1, 9))
        assert not fake.is_enabled()
        with det.detection_section("cpu", profile_cuda=False):
            assert not fake.is_enabled()
            fake.launch(Activity(K, "not_profiled", 1, 2))
    assert fake.toggles == 4
    fake.dropped = 3
    report = det.generate_report()
    assert report is not None
    assert set(report.local_kernel_summaries) == {"gemm_blk_128_1_1_grid_1_1_1"}
    gemm = report.local_kernel_summaries["gemm_blk_128_1_1_grid_1_1_1"]
    assert gemm[Statistic.NUM] == 4
    assert gemm[Statistic.MED] == pytest.approx(11.5)  # (11 + 12) / 2 microseconds
    assert report.kernel_timing is not None
    assert report.kernel_timing.available
    assert report.kernel_timing.dropped_records == 3 + 4  # CUPTI drops + zero timestamps
    assert report.dropped_kernel_records == {0: 7}
    assert report.gpu_relative_perf_scores == {0: 1.0}
    det.close()
    assert not fake.finalized  # other CUPTI users keep working


def test_another_cupti_subscriber_is_reported_and_sections_carry_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    timer = make_kernel_timer(cupti_module=FakeCupti(busy=True))
    assert not timer.status.available
    assert "another CUPTI subscriber" in (timer.status.reason or "")
    det = StragglerDetector(kernel_timer=timer)
    with det.detection_section("fwd"):
        pass
    report = det.generate_report()
    assert report is not None
    assert report.section_relative_perf_scores == {"fwd": {0: 1.0}}
    reasons = [n.reason for n in report.non_comparable if n.score == "gpu_relative"]
    assert reasons
    assert "another CUPTI subscriber" in reasons[0]
    det.close()


def test_enable_failure_turns_kernel_timing_off_with_a_reason() -> None:
    fake = FakeCupti(enable_fails=True)
    det = StragglerDetector(kernel_timer=make_kernel_timer(cupti_module=fake))
    for _ in range(2):
        with det.detection_section("fwd"):
            pass
    report = det.generate_report()
    assert report is not None
    assert report.kernel_timing is not None
    assert not report.kernel_timing.available
    assert "activity_enable failed" in (report.kernel_timing.reason or "")
    assert report.section_relative_perf_scores["fwd"] == {0: 1.0}
    det.close()


def test_import_needs_neither_cuda_nor_cupti(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)  # makes "import cupti" fail
    for name in [m for m in sys.modules if m.startswith("nvrx.straggler")]:
        monkeypatch.delitem(sys.modules, name)
    straggler = importlib.import_module("nvrx.straggler")
    det = straggler.StragglerDetector()
    assert not det.kernel_timer.status.available
    det.close()


def test_only_one_cupti_timer_per_process() -> None:
    first = make_kernel_timer(cupti_module=FakeCupti())
    second = make_kernel_timer(cupti_module=FakeCupti())
    assert isinstance(first, CuptiKernelTimer)
    assert not second.status.available
    assert "another StragglerDetector" in (second.status.reason or "")
    first.close()
    third = make_kernel_timer(cupti_module=FakeCupti())
    assert isinstance(third, CuptiKernelTimer)
    third.close()


def test_a_subscribed_profiler_is_detected_before_registering() -> None:
    fake = FakeCupti(subscribed=True)
    timer = make_kernel_timer(cupti_module=fake)
    assert not timer.status.available
    assert "another CUPTI subscriber" in (timer.status.reason or "")
    assert fake.completed is None  # our callbacks were never registered
    free = FakeCupti()
    timer = make_kernel_timer(cupti_module=free)
    assert timer.status.available
    assert free.unsubscribed == 1  # the probe cleaned up after itself
    timer.close()


def test_sections_without_kernel_records_explain_why() -> None:
    det = StragglerDetector(kernel_timer=make_kernel_timer(cupti_module=FakeCupti()))
    with det.detection_section("fwd"):
        pass  # enabled, but nothing launched (or someone else took the buffers)
    report = det.generate_report()
    assert report is not None
    assert report.kernel_timing is not None
    assert "delivered no kernel records" in (report.kernel_timing.reason or "")
    reasons = [n.reason for n in report.non_comparable if n.score == "gpu_relative"]
    assert "delivered no kernel records" in reasons[0]
    det.close()


def _documented_signature(func: Any) -> inspect.Signature:
    """The signature cupti-python's Cython functions state on their docstring's first line."""
    first = (func.__doc__ or "").splitlines()[0]
    inside = first[first.index("(") + 1 : first.index(")")]
    names = [part.split(":")[0].strip() for part in inside.split(",") if part.strip()]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(name, kind) for name in names])


class ConformingCupti:
    """FakeCupti behind the real cupti-python's names and signatures.

    Every call the timer makes is bound to the real binding's documented signature
    first, so a wrong argument count or an unknown function fails here, on CPU,
    instead of on a GPU node as a logged warning.
    """

    def __init__(self, real: Any, fake: FakeCupti) -> None:
        self._real = real
        self._fake = fake
        self.ActivityKind = real.ActivityKind
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        signature = _documented_signature(getattr(self._real, name))
        target = getattr(self._fake, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            signature.bind(*args, **kwargs)
            self.called.append(name)
            return target(*args, **kwargs)

        return call


def test_every_cupti_call_matches_the_installed_cupti_python() -> None:
    real = pytest.importorskip("cupti.cupti", reason="cupti-python is in the test group")
    assert int(real.ActivityKind.CONCURRENT_KERNEL) == int(ActivityKind.CONCURRENT_KERNEL)
    fake = FakeCupti()
    conforming = ConformingCupti(real, fake)
    timer = make_kernel_timer(cupti_module=conforming)
    assert isinstance(timer, CuptiKernelTimer)
    det = StragglerDetector(kernel_timer=timer)
    with det.detection_section("fwd"):
        fake.launch(Activity(K, "gemm", 1_000, 3_000))
    fake.dropped = 5
    report = det.generate_report()
    assert report is not None
    assert report.kernel_timing is not None
    assert report.kernel_timing.dropped_records == 5
    det.close()
    assert set(conforming.called) == {
        "subscribe",
        "unsubscribe",
        "activity_register_callbacks",
        "activity_enable",
        "activity_disable",
        "activity_flush_all",
        "activity_get_num_dropped_records",
    }


def test_the_real_multiple_subscribers_error_is_recognised() -> None:
    real = pytest.importorskip("cupti.cupti", reason="cupti-python is in the test group")
    fake = FakeCupti()

    def busy(callback: Any, userdata: Any) -> int:
        raise real.cuptiError(int(real.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))

    fake.subscribe = busy  # type: ignore[method-assign]
    timer = make_kernel_timer(cupti_module=ConformingCupti(real, fake))
    assert not timer.status.available
    assert "another CUPTI subscriber" in (timer.status.reason or "")
    assert fake.completed is None


@pytest.mark.parametrize(
    ("cupti", "cuda", "extra"),
    [
        ("13.4.0", "12.8", "cupti-cu12"),
        ("12.8.0", "13.0", "cupti-cu13"),
    ],
)
def test_a_cupti_of_another_cuda_major_is_refused_naming_the_extra(
    cupti: str, cuda: str, extra: str
) -> None:
    why = cuda_major_mismatch(cupti, cuda)
    assert why is not None
    assert f"cupti-python {cupti} is for CUDA {cupti.split('.')[0]}" in why
    assert f"nvrx-straggler[{extra}]" in why


@pytest.mark.parametrize(
    ("cupti", "cuda"), [("13.4.0", "13.0"), ("12.8.0", "12.6"), (None, "13.0"), ("13.4.0", None)]
)
def test_matching_or_unknown_cuda_majors_are_accepted(cupti: str | None, cuda: str | None) -> None:
    assert cuda_major_mismatch(cupti, cuda) is None
