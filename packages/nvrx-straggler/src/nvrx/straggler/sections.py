"""Section timing: the one definition of what an entry does, and the sections it fills.

``detection_section`` hands out one reusable handle per section name (and per
``profile_cuda`` choice) instead of a generator-based context manager: entering and
leaving it is two short method calls. An entry is defined here, by
:class:`EntryCounter`, :class:`SectionHandle` and :meth:`SectionRegistry.enter`:

* every entry adds one to the section's :class:`EntryCounter`;
* an outermost entry whose count before it is a multiple of ``profiling_interval``
  is measured: the kernel timer (``profile_cuda``) is started, the clock read;
* entries of the same handle inside a measured one are counted, not timed;
* leaving the measured entry appends its host time in milliseconds to the section,
  unless it ended with an exception, and stops the kernel timer in any case.

A section name normally belongs to one code location (``file:line`` of the ``with``
statement). Entering it from another location records into the same section, as
NVRx does, and logs one warning naming both places; after that warning the name's
call sites are no longer checked. Calls without a name are keyed by call site.

Where the optional C extension ``_hotpath`` is built, it accelerates exactly this
definition (the ``detection_section`` call, the handle and the counter); ``HOT_PATH``
says which runs, and ``tests/test_hotpath_parity.py`` runs the same scripted entries
through both. Set ``NVRX_STRAGGLER_PURE_PYTHON=1`` to run the Python path. This
module does not import torch.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from types import CodeType, FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from nvrx.straggler import _native
from nvrx.straggler.statistics import Statistic, summarize

if TYPE_CHECKING:
    from nvrx.straggler._kernels import KernelTimer

__all__ = [
    "HOT_PATH",
    "CudaEventTimes",
    "CustomSection",
    "EntryCounter",
    "SectionContext",
    "SectionHandle",
    "SectionRegistry",
]

#: The error of a Detector call before Detector.initialize() (or after shutdown());
#: it starts with NVRx's words, then says what to do.
NOT_INITIALIZED = (
    "Detector is not initialized. Call Detector.initialize(...) first (the Lightning "
    "StragglerDetectionCallback does it in setup), and again after Detector.shutdown()."
)

log = logging.getLogger(__name__)

_perf = __import__("time").perf_counter_ns


#: The C extension, or None where it is not built or is switched off (see _native).
hotpath: ModuleType | None = _native.hotpath
#: Which implementation times sections in this process: ``"c"`` or ``"python"``.
HOT_PATH: str = _native.HOT_PATH


class EntryCounter:
    """The entry count of one section, shared by its handles (``_hotpath.Counter`` in C)."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        if value < 0:
            raise ValueError(f"EntryCounter: value must be >= 0, got {value!r}")
        self.value = value


class _Counter(Protocol):
    value: int


class CustomSection:
    """A user-defined section of code (``Detector.detection_section``) and its timings.

    NVRx's fields, with the same constructor. ``cpu_elapsed_times`` holds the host
    wall time in milliseconds of the measured entries since the last report, at most
    ``max_elapseds_len`` of them (the oldest are evicted). ``total_entry_cnt`` counts
    every entry since the detector started; it reads the section's :attr:`counter`,
    which the handles (Python or C) advance.
    """

    __slots__ = (
        "counter",
        "cpu_elapsed_times",
        "location",
        "max_elapseds_len",
        "name",
        "window_start_cnt",
    )

    def __init__(
        self,
        name: str,
        location: str,
        total_entry_cnt: int = 0,
        max_elapseds_len: int = 8 * 1024,
        cpu_elapsed_times: Iterable[float] = (),
        *,
        counter: _Counter | None = None,
    ) -> None:
        if max_elapseds_len < 1:
            raise ValueError(f"max_elapseds_len must be >= 1, got {max_elapseds_len!r}")
        self.name = name
        self.location = location
        self.max_elapseds_len = max_elapseds_len
        self.cpu_elapsed_times: deque[float] = deque(cpu_elapsed_times, maxlen=max_elapseds_len)
        self.counter: _Counter = EntryCounter() if counter is None else counter
        self.counter.value = total_entry_cnt
        self.window_start_cnt = 0

    @property
    def total_entry_cnt(self) -> int:
        """Entries since the detector started (measured or not)."""
        return self.counter.value

    @total_entry_cnt.setter
    def total_entry_cnt(self, value: int) -> None:
        self.counter.value = value

    def __repr__(self) -> str:
        return (
            f"CustomSection(name={self.name!r}, location={self.location!r}, "
            f"total_entry_cnt={self.total_entry_cnt}, max_elapseds_len={self.max_elapseds_len}, "
            f"samples={len(self.cpu_elapsed_times)})"
        )

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
    """What ``detection_section`` returns: a :class:`SectionHandle`, its C twin, or a
    CUDA event wrapper around one of them."""

    @property
    def section(self) -> CustomSection: ...
    @property
    def code(self) -> CodeType | None: ...
    @code.setter
    def code(self, value: CodeType | None) -> None: ...
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
    """The context manager ``detection_section`` returns: the definition of an entry.

    ``code``/``lasti`` are the first call site (``code`` None: sites are not checked
    any more); ``accepted`` holds every call site accepted for the name.
    """

    __slots__ = (
        "_append",
        "_counter",
        "_interval",
        "_nested",
        "_t0",
        "_timer",
        "accepted",
        "code",
        "lasti",
        "section",
    )

    def __init__(
        self,
        section: CustomSection,
        interval: int,
        code: CodeType,
        lasti: int,
        timer: KernelTimer | None = None,
    ) -> None:
        if interval < 1:
            raise ValueError(f"Handle: interval must be >= 1, got {interval}")
        self.section = section
        self.code: CodeType | None = code
        self.lasti = lasti
        self.accepted: set[tuple[str, CodeType, int]] = {(code.co_filename, code, lasti)}
        self._counter = section.counter
        self._interval = interval
        self._timer = timer
        self._append = section.cpu_elapsed_times.append
        self._nested = 0
        self._t0 = 0

    @property
    def timer(self) -> KernelTimer | None:
        """The kernel timer switched on for measured entries, or None."""
        return self._timer

    @property
    def measuring(self) -> bool:
        """True inside a measured entry."""
        return self._t0 != 0

    def __enter__(self) -> None:
        counter = self._counter
        n = counter.value
        counter.value = n + 1
        if self._t0:
            self._nested += 1
        elif n % self._interval == 0:
            timer = self._timer
            if timer is not None:
                timer.start()
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
        if not t0:
            return
        self._t0 = 0
        timer = self._timer
        if timer is None:
            if exc_type is None:
                self._append((_perf() - t0) * 1e-6)
            return
        try:
            if exc_type is None:
                self._append((_perf() - t0) * 1e-6)
        finally:
            timer.stop()


class _CudaEventSectionHandle:
    """A handle that also records a CUDA event pair around measured entries."""

    __slots__ = (
        "_event_cls",
        "_events",
        "_inner",
        "_start_event",
        "accepted",
        "code",
        "lasti",
        "section",
    )

    def __init__(self, inner: SectionContext, events: CudaEventTimes) -> None:
        import torch

        self.section = inner.section
        self.code = inner.code
        self.lasti = inner.lasti
        self.accepted = inner.accepted
        self._inner = inner
        self._events = events
        self._event_cls: Any = torch.cuda.Event
        self._start_event: Any = None

    @property
    def measuring(self) -> bool:
        """True inside a measured entry."""
        return self._inner.measuring

    @property
    def _nested(self) -> int:
        return self._inner._nested

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
        self.closed = False
        self._anonymous: dict[tuple[str, CodeType, int, bool], SectionContext] = {}
        self._reused: set[str] = set()
        self._kernel_timer = kernel_timer
        self._max_samples = max_samples
        self._cuda_event_timing = cuda_event_timing
        self._lock = threading.Lock()
        self.hotpath = hotpath

    @property
    def implementation(self) -> str:
        """``"c"`` or ``"python"``: what times this registry's sections."""
        return "python" if self.hotpath is None else "c"

    def enter(self, name: str | None, profile_cuda: bool, frame: FrameType) -> SectionContext:
        """``detection_section(name, profile_cuda)`` called from ``frame``: its handle.

        The per-call dispatch in Python; :meth:`dispatcher` is the same in C.
        """
        try:
            h = (self.kernel_handles if profile_cuda else self.cpu_handles)[name]
        except KeyError:
            return self.miss(name, profile_cuda, frame)
        code = h.code
        if code is not None and (frame.f_code is not code or frame.f_lasti != h.lasti):
            self.check_location(h, frame)
        return h

    def dispatcher(self) -> Callable[..., SectionContext] | None:
        """:meth:`enter` in C, called as ``detection_section``; None without the extension.

        It returns the handle of a known call site itself, and calls :meth:`miss` or
        :meth:`check_location` for everything else.
        """
        if self.hotpath is None:
            return None
        fast: Callable[..., SectionContext] = self.hotpath.Dispatcher(
            self.cpu_handles, self.kernel_handles, self._anonymous, self.miss, self.check_location
        )
        return fast

    def miss(self, name: str | None, profile_cuda: bool, frame: FrameType) -> SectionContext:
        """Slow path: find or create the handle for a section entered from ``frame``."""
        if self.closed:
            raise RuntimeError(NOT_INITIALIZED)
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
                    counter = EntryCounter() if self.hotpath is None else self.hotpath.Counter()
                    section = CustomSection(
                        name, location, max_elapseds_len=self._max_samples, counter=counter
                    )
                    self.sections[name] = section
                found = self._make_handle(section, profile_cuda, frame.f_code, frame.f_lasti)
                handles[name] = found
                if section.location != location:
                    self._reused_at(found, location)
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
        else:
            inner = SectionHandle(section, interval, code, lasti, timer)
        if not (profile_cuda and self._cuda_event_timing):
            return inner
        events = self.cuda_events.setdefault(section.name, CudaEventTimes(self._max_samples))
        return _CudaEventSectionHandle(inner, events)

    def check_location(self, handle: SectionContext, frame: FrameType) -> None:
        """A call site not seen before: accept it; another file:line is logged once."""
        site = _site(frame)
        if site in handle.accepted:
            return
        location = _location(frame)
        if location != handle.section.location:
            self._reused_at(handle, location)
            return
        handle.accepted.add(site)

    def _reused_at(self, handle: SectionContext, location: str) -> None:
        """The section's name is used at a second location: both record into it (NVRx)."""
        handle.code = None  # its call sites are no longer checked
        name = handle.section.name
        if name in self._reused:
            return
        self._reused.add(name)
        log.warning(
            "detection_section: name %r is used at %s and again at %s; both record into the "
            "same section (give each code location its own name to time them apart)",
            name,
            handle.section.location,
            location,
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

    def close(self) -> None:
        """Forget every handle: later entries take the slow path and are refused."""
        self.closed = True
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
