"""Section timing: the per-entry hot path and the sections it fills.

``detection_section`` hands out one reusable handle per section name (and per
``profile_cuda`` choice) instead of a generator-based context manager: entering and
leaving it is two short method calls. One entry in every ``profiling_interval`` is
measured; nested entries of the same section are counted but only the outermost is
timed. An entry that ends with an exception is not timed. Host times are stored in
milliseconds.

A section name belongs to one code location (``file:line`` of the ``with``
statement): entering it from another location raises ValueError, because merged
timings of different code would make its scores meaningless. The location of a
call with an explicit name is found once, on the first entry; later entries only
compare the caller's code object and instruction offset.

Where the optional C extension ``_hotpath`` is built, it runs the per-entry path
(the ``detection_section`` call and the CPU handle); ``HOT_PATH`` says which one
runs. The Python classes here define the behaviour and are used everywhere else.
Set ``NVRX_STRAGGLER_PURE_PYTHON=1`` to run the Python path.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from nvrx.straggler.statistics import Statistic, summarize

if TYPE_CHECKING:
    from nvrx.straggler.kernels import KernelTimer

__all__ = [
    "HOT_PATH",
    "CudaEventTimes",
    "CustomSection",
    "SectionContext",
    "SectionHandle",
    "SectionRegistry",
]

_perf = __import__("time").perf_counter_ns


def _load_hotpath() -> ModuleType | None:
    if os.environ.get("NVRX_STRAGGLER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from nvrx.straggler import _hotpath
    except ImportError:
        return None
    return _hotpath


#: The C extension, or None where it is not built or is switched off.
hotpath: ModuleType | None = _load_hotpath()
#: Which implementation times sections in this process: ``"c"`` or ``"python"``.
HOT_PATH: str = "python" if hotpath is None else "c"


@dataclasses.dataclass(eq=False, slots=True)
class CustomSection:
    """A user-defined section of code (``Detector.detection_section``) and its timings.

    ``cpu_elapsed_times`` holds the host wall time in milliseconds of the measured
    entries since the last report, at most ``max_elapseds_len`` of them (the oldest
    are evicted). ``total_entry_cnt`` counts every entry since the detector started.
    """

    name: str
    location: str
    total_entry_cnt: int = 0
    max_elapseds_len: int = 8 * 1024
    cpu_elapsed_times: deque[float] = dataclasses.field(default_factory=deque)
    window_start_cnt: int = 0

    def __post_init__(self) -> None:
        if self.max_elapseds_len < 1:
            raise ValueError(f"max_elapseds_len must be >= 1, got {self.max_elapseds_len!r}")
        if self.cpu_elapsed_times.maxlen != self.max_elapseds_len:
            self.cpu_elapsed_times = deque(self.cpu_elapsed_times, maxlen=self.max_elapseds_len)

    def sampled_entries(self, profiling_interval: int) -> int:
        """Entries of this window picked for measurement (index multiple of the interval)."""
        start, end = self.window_start_cnt, self.total_entry_cnt
        return (end + profiling_interval - 1) // profiling_interval - (
            start + profiling_interval - 1
        ) // profiling_interval


class CudaEventTimes:
    """GPU time of section entries from CUDA event pairs, resolved at report time."""

    def __init__(self, max_len: int) -> None:
        self.pending: deque[tuple[Any, Any]] = deque(maxlen=max_len)

    def elapsed_ms(self) -> list[float]:
        """Milliseconds between each recorded pair; needs a synchronised device."""
        out = [float(start.elapsed_time(end)) for start, end in self.pending]
        self.pending.clear()
        return out


class SectionContext(Protocol):
    """What ``detection_section`` returns, in Python (:class:`SectionHandle`) or in C."""

    @property
    def section(self) -> CustomSection: ...
    @property
    def code(self) -> CodeType: ...
    @property
    def lasti(self) -> int: ...
    @property
    def accepted(self) -> set[tuple[str, CodeType, int]]: ...
    @property
    def measuring(self) -> bool: ...
    @property
    def _nested(self) -> int: ...
    def __enter__(self) -> None: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class SectionHandle:
    """The context manager ``detection_section`` returns: cheap to enter and leave."""

    __slots__ = ("_append", "_interval", "_nested", "_t0", "accepted", "code", "lasti", "section")

    def __init__(self, section: CustomSection, interval: int, code: CodeType, lasti: int) -> None:
        self.section = section
        self.code = code
        self.lasti = lasti
        self.accepted: set[tuple[str, CodeType, int]] = {(code.co_filename, code, lasti)}
        self._interval = interval
        self._append = section.cpu_elapsed_times.append
        self._nested = 0
        self._t0 = 0

    @property
    def measuring(self) -> bool:
        """True inside a measured entry."""
        return self._t0 != 0

    def __enter__(self) -> None:
        sec = self.section
        n = sec.total_entry_cnt
        sec.total_entry_cnt = n + 1
        if self._t0:
            self._nested += 1
        elif n % self._interval == 0:
            self._t0 = _perf()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._nested:
            self._nested -= 1
            return
        t0 = self._t0
        if t0:
            self._t0 = 0
            if exc_type is None:
                self._append((_perf() - t0) * 1e-6)


class _KernelSectionHandle(SectionHandle):
    """A handle that also switches kernel timing on for measured entries."""

    __slots__ = ("_timer",)

    def __init__(
        self, section: CustomSection, interval: int, code: CodeType, lasti: int, timer: KernelTimer
    ) -> None:
        super().__init__(section, interval, code, lasti)
        self._timer = timer

    def __enter__(self) -> None:
        sec = self.section
        n = sec.total_entry_cnt
        sec.total_entry_cnt = n + 1
        if self._t0:
            self._nested += 1
        elif n % self._interval == 0:
            self._timer.start()
            self._t0 = _perf()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._nested:
            self._nested -= 1
            return
        t0 = self._t0
        if t0:
            self._t0 = 0
            try:
                if exc_type is None:
                    self._append((_perf() - t0) * 1e-6)
            finally:
                self._timer.stop()


class _CudaEventSectionHandle(SectionHandle):
    """A handle that also records a CUDA event pair around measured entries."""

    __slots__ = ("_event_cls", "_events", "_inner", "_start_event")

    def __init__(
        self,
        section: CustomSection,
        interval: int,
        code: CodeType,
        lasti: int,
        inner: SectionContext,
        events: CudaEventTimes,
    ) -> None:
        super().__init__(section, interval, code, lasti)
        import torch

        self._inner = inner
        self._events = events
        self._event_cls: Any = torch.cuda.Event
        self._start_event: Any = None

    def __enter__(self) -> None:
        inner = self._inner
        inner.__enter__()
        if inner.measuring and not inner._nested and self._start_event is None:
            ev = self._event_cls(enable_timing=True)
            ev.record()
            self._start_event = ev

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        inner = self._inner
        start = self._start_event
        if start is not None and not inner._nested:
            self._start_event = None
            if exc_type is None:
                end = self._event_cls(enable_timing=True)
                end.record()
                self._events.pending.append((start, end))
        inner.__exit__(exc_type, exc, tb)


def _location(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _site(frame: FrameType) -> tuple[str, CodeType, int]:
    """A call site. Code objects of different files can compare equal: the file is in it."""
    code = frame.f_code
    return code.co_filename, code, frame.f_lasti


class SectionRegistry:
    """Owns the sections of one detector and the handles that time them."""

    def __init__(
        self,
        profiling_interval: int,
        kernel_timer: KernelTimer | None,
        *,
        max_samples: int = 8 * 1024,
        cuda_event_timing: bool = False,
    ) -> None:
        self.profiling_interval = profiling_interval
        self.sections: dict[str, CustomSection] = {}
        self.cpu_handles: dict[str | None, SectionContext] = {}
        self.kernel_handles: dict[str | None, SectionContext] = {}
        self.cuda_events: dict[str, CudaEventTimes] = {}
        self._anonymous: dict[tuple[str, CodeType, int, bool], SectionContext] = {}
        self._kernel_timer = kernel_timer
        self._max_samples = max_samples
        self._cuda_event_timing = cuda_event_timing
        self._lock = threading.Lock()
        self.hotpath = hotpath

    @property
    def implementation(self) -> str:
        """``"c"`` or ``"python"``: what times this registry's sections."""
        return "python" if self.hotpath is None else "c"

    def dispatcher(
        self, miss: Callable[[str | None, bool, FrameType], SectionContext]
    ) -> Callable[..., SectionContext] | None:
        """The C ``detection_section`` over this registry, or None without the extension.

        It returns the handle of a known call site itself, and calls ``miss`` (the slow
        path, :meth:`handle` behind the detector's checks) or :meth:`check_location`.
        """
        if self.hotpath is None:
            return None
        fast: Callable[..., SectionContext] = self.hotpath.Dispatcher(
            self.cpu_handles, self.kernel_handles, self._anonymous, miss, self.check_location
        )
        return fast

    def handle(self, name: str | None, profile_cuda: bool, frame: FrameType) -> SectionContext:
        """Slow path: find or create the handle for a section entered from ``frame``."""
        code, lasti = frame.f_code, frame.f_lasti
        anonymous_key = (*_site(frame), bool(profile_cuda))
        if name is None:
            found = self._anonymous.get(anonymous_key)
            if found is not None:
                return found
        elif not isinstance(name, str) or not name:
            raise ValueError(f"detection_section: name must be a non-empty str, got {name!r}")
        location = _location(frame)
        name = location if name is None else name
        handles = self.kernel_handles if profile_cuda else self.cpu_handles
        with self._lock:
            found = handles.get(name)
            if found is not None:
                self.check_location(found, frame)
            else:
                section = self.sections.get(name)
                if section is None:
                    section = CustomSection(name, location, max_elapseds_len=self._max_samples)
                    self.sections[name] = section
                elif section.location != location:
                    raise ValueError(self._reuse_message(name, section.location, location))
                found = handles[name] = self._make_handle(section, profile_cuda, code, lasti)
            if name == location:  # later entries without a name find it by call site
                self._anonymous[anonymous_key] = found
            return found

    def _make_handle(
        self, section: CustomSection, profile_cuda: bool, code: CodeType, lasti: int
    ) -> SectionContext:
        timer = self._kernel_timer
        interval = self.profiling_interval
        if not (profile_cuda and timer is not None and timer.status.available):
            timer = None
        inner: SectionContext
        if self.hotpath is not None:
            inner = self.hotpath.Handle(section, interval, code, lasti, timer)
        elif timer is not None:
            inner = _KernelSectionHandle(section, interval, code, lasti, timer)
        else:
            inner = SectionHandle(section, interval, code, lasti)
        if not (profile_cuda and self._cuda_event_timing):
            return inner
        events = self.cuda_events.setdefault(section.name, CudaEventTimes(self._max_samples))
        return _CudaEventSectionHandle(section, interval, code, lasti, inner, events)

    def check_location(self, handle: SectionContext, frame: FrameType) -> None:
        """Accept a new call site of a section only if it is the same file:line."""
        site = _site(frame)
        if site in handle.accepted:
            return
        location = _location(frame)
        if location != handle.section.location:
            raise ValueError(
                self._reuse_message(handle.section.name, handle.section.location, location)
            )
        handle.accepted.add(site)

    @staticmethod
    def _reuse_message(name: str, first: str, again: str) -> str:
        return (
            f"detection_section: name {name!r} is already used at {first} and is entered "
            f"again at {again}; give each code location its own section name"
        )

    def summaries(self) -> dict[str, dict[Statistic, float]]:
        """Statistics (ms) of each section measured in this window."""
        out: dict[str, dict[Statistic, float]] = {}
        for name, section in list(self.sections.items()):
            samples = section.cpu_elapsed_times
            if not samples:
                continue
            count = len(samples)
            if count == samples.maxlen:
                count = max(count, section.sampled_entries(self.profiling_interval))
            out[name] = summarize(samples, count)
        for name, events in self.cuda_events.items():
            gpu = events.elapsed_ms()
            if gpu:
                out[f"{name} [cuda]"] = summarize(gpu)
        return out

    def drop_handles(self) -> None:
        """Forget every handle: later entries take the slow path (a closed detector)."""
        self.cpu_handles.clear()
        self.kernel_handles.clear()
        self._anonymous.clear()

    def reset_window(self) -> None:
        """Start a new window: clear samples, keep sections and entry counters."""
        for section in self.sections.values():
            section.cpu_elapsed_times.clear()
            section.window_start_cnt = section.total_entry_cnt
        for events in self.cuda_events.values():
            events.pending.clear()
