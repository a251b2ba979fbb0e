"""The straggler detector: an instance API and the reference's class-method facade.

:class:`StragglerDetector` holds everything (sections, kernel timer, report generator,
interval tracker, wrapped callables); tests and libraries create and close as many
as they like. :class:`Detector` keeps NVRx's class-method API on top of one
process-wide instance: ``initialize`` and ``shutdown`` are idempotent and may be
called in any order.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from nvrx.straggler._drift import SustainedSlowdownRule
from nvrx.straggler._interval import ReportIntervalTracker
from nvrx.straggler._kernels import DEFAULT_MAX_SAMPLES_PER_KERNEL, KernelTimer
from nvrx.straggler._report import Report, parse_scores_to_compute
from nvrx.straggler._report_generator import DEFAULT_COMM_KERNEL_PATTERN, ReportGenerator
from nvrx.straggler._wrapping import CallableId, CallableWrapper
from nvrx.straggler.sections import (
    NOT_INITIALIZED,
    CustomSection,
    SectionContext,
    SectionRegistry,
)

__all__ = ["Detector", "StragglerDetector"]

log = logging.getLogger(__name__)

_getframe = sys._getframe

_DEFAULT_RULE: Any = object()
"""Stands for "a new SustainedSlowdownRule() per detector" (a rule holds state)."""


class StragglerDetector:
    """One straggler detector: time sections, score ranks, report.

    The first five parameters are the reference's ``Detector.initialize`` ones.
    ``pg`` is the process group of every collective (None: the default group).
    ``kernel_timer`` replaces the CUPTI timer (e.g. a
    :class:`~nvrx.straggler._kernels.SyntheticKernelTimer`); by default CUPTI is used
    when cupti-python and a GPU are present. ``comm_kernel_pattern`` is the regex of
    communication kernels left out of GPU scores. ``individual_baseline_windows`` is
    how many reports the individual baseline remembers. ``cuda_event_timing`` also
    times profiled sections on the GPU with CUDA events (reported as
    ``"<name> [cuda]"`` sections). ``sustained_slowdown_rule`` is the rule behind
    ``Report.identify_sustained_stragglers`` (None: off; see
    :class:`~nvrx.straggler.SustainedSlowdownRule`).
    """

    def __init__(
        self,
        scores_to_compute: str | Sequence[str] = "all",
        gather_on_rank0: bool = True,
        profiling_interval: int = 1,
        report_time_interval: float = 60,
        node_name: str | None = None,
        *,
        pg: Any = None,
        kernel_timer: KernelTimer | None = None,
        comm_kernel_pattern: str = DEFAULT_COMM_KERNEL_PATTERN,
        individual_baseline_windows: int = 10,
        cuda_event_timing: bool = False,
        max_samples_per_section: int = 8 * 1024,
        max_samples_per_kernel: int = DEFAULT_MAX_SAMPLES_PER_KERNEL,
        sustained_slowdown_rule: SustainedSlowdownRule | None = _DEFAULT_RULE,
    ) -> None:
        if isinstance(profiling_interval, bool) or not isinstance(profiling_interval, int):
            raise ValueError(f"profiling_interval must be an int >= 1, got {profiling_interval!r}")
        if profiling_interval < 1:
            raise ValueError(f"profiling_interval must be an int >= 1, got {profiling_interval!r}")
        self.scores_to_compute = list(parse_scores_to_compute(scores_to_compute))
        self.gather_on_rank0 = gather_on_rank0
        self.profiling_interval = profiling_interval
        self.report_time_interval = float(report_time_interval)
        self.node_name = node_name if node_name is not None else socket.gethostname()
        self.settings: dict[str, Any] = {
            "scores_to_compute": tuple(self.scores_to_compute),
            "gather_on_rank0": gather_on_rank0,
            "profiling_interval": profiling_interval,
            "report_time_interval": self.report_time_interval,
            "node_name": self.node_name,
        }
        self.reporter = ReportGenerator(
            self.scores_to_compute,
            gather_on_rank0,
            pg,
            self.node_name,
            comm_kernel_pattern=comm_kernel_pattern,
            individual_baseline_windows=individual_baseline_windows,
            sustained_slowdown_rule=(
                SustainedSlowdownRule()
                if sustained_slowdown_rule is _DEFAULT_RULE
                else sustained_slowdown_rule
            ),
        )
        self.report_interval_tracker = ReportIntervalTracker(
            time_interval=self.report_time_interval,
            profiling_interval=profiling_interval,
            agree=self._agree_interval,
        )
        if kernel_timer is None:
            from nvrx.straggler._cupti_timer import make_kernel_timer

            kernel_timer = make_kernel_timer(max_samples_per_kernel)
        self.kernel_timer: KernelTimer = kernel_timer
        self.cuda_event_timing = cuda_event_timing
        if cuda_event_timing and not torch.cuda.is_available():
            log.warning("straggler detection: cuda_event_timing needs a CUDA device; it is off")
            self.cuda_event_timing = False
        self._sections = SectionRegistry(
            profiling_interval,
            kernel_timer,
            max_samples=max_samples_per_section,
            cuda_event_timing=self.cuda_event_timing,
        )
        fast = self._sections.dispatcher()
        if fast is not None:
            # The C version of the method below, for this instance (sections.py).
            self.detection_section = fast  # type: ignore[method-assign]
        self._wrapper = CallableWrapper(self.detection_section)
        self.closed = False

    # -- sections -------------------------------------------------------------------

    @property
    def custom_sections(self) -> dict[str, CustomSection]:
        """Section name -> its :class:`CustomSection`."""
        return self._sections.sections

    @property
    def cupti_manager(self) -> KernelTimer:
        """The kernel timer (the reference's name for it)."""
        return self.kernel_timer

    def detection_section(
        self, name: str | None = None, profile_cuda: bool = True
    ) -> SectionContext:
        """A context manager timing the enclosed code as section ``name``.

        ``name`` defaults to the ``file:line`` of the call; a name may be used at one
        location only. With ``profile_cuda``, kernels launched inside are timed too.
        """
        return self._sections.enter(name, profile_cuda, _getframe(1))

    # -- callables ------------------------------------------------------------------

    @property
    def original_callables(self) -> dict[CallableId, object]:
        """CallableId -> the callable found when it was wrapped."""
        return self._wrapper.original_callables

    def wrap_callables(self, callable_ids: list[CallableId], profile_cuda: bool = True) -> None:
        """Run each callable inside ``detection_section(str(callable_id))``."""
        self._require_open()
        self._wrapper.wrap(callable_ids, profile_cuda)

    def restore_original_callables(self) -> None:
        """Put back every wrapped callable exactly as it was."""
        self._wrapper.restore()

    # -- reports --------------------------------------------------------------------

    def _agree_interval(self, proposal: float) -> float:
        t = torch.tensor([-proposal], dtype=torch.float64)
        return -float(self.reporter.comm.all_reduce_min(t)[0])

    def _uses_gpu(self) -> bool:
        return (self.kernel_timer.status.available or self.cuda_event_timing) and bool(
            torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        )

    def _generate(self, interval_proposal: float | None) -> Report | None:
        self._require_open()
        if self._uses_gpu():
            torch.cuda.synchronize()
        window = self.kernel_timer.collect()
        sections = self._sections.summaries()
        kernels = window.summaries()
        self._sections.reset_window()
        return self.reporter.generate_report(
            sections, kernels, kernel_status=window.status, interval_proposal=interval_proposal
        )

    def generate_report(self) -> Report | None:
        """Score the window since the last report and start a new one.

        Collective when scores need other ranks: call it on every rank. Returns None
        on ranks other than 0 when ``gather_on_rank0``.
        """
        return self._generate(None)

    def generate_report_if_interval_elapsed(self) -> Report | None:
        """Call once per training iteration on every rank; reports when the interval elapsed."""
        self._require_open()
        tracker = self.report_interval_tracker
        tracker.iter_increase()
        if not tracker.is_interval_elapsed():
            return None
        proposal = tracker.propose_interval()
        report = self._generate(proposal)
        agreed = self.reporter.last_agreed_interval
        tracker.apply_agreed_interval(proposal if agreed is None else agreed)
        return report

    def is_interval_elapsed(self) -> bool:
        """True if the last ``generate_report_if_interval_elapsed`` call reported."""
        return self.report_interval_tracker.is_interval_elapsed()

    def reset_individual_baselines(self) -> None:
        """Forget the individual baselines, e.g. after a deliberate change of workload."""
        self.reporter.reset_individual_baselines()
        if self.reporter.sustained_slowdown_rule is not None:
            self.reporter.sustained_slowdown_rule.reset()

    # -- lifecycle ------------------------------------------------------------------

    def _require_open(self) -> None:
        if self.closed:
            raise RuntimeError(NOT_INITIALIZED)

    def close(self) -> None:
        """Restore wrapped callables and release the kernel timer; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._wrapper.restore()
        self._sections.close()
        self.kernel_timer.close()

    def __enter__(self) -> StragglerDetector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ClassAttributes(type):
    """The reference's class attributes of :class:`Detector`, read from the current
    instance at each access (nothing is copied, so nothing outlives a shutdown).

    Before ``initialize`` and after ``shutdown`` they read as a fresh detector's
    settings, empty mappings and None.
    """

    _instance: StragglerDetector | None

    @property
    def initialized(cls) -> bool:
        """True between ``initialize`` and ``shutdown``."""
        return cls._instance is not None

    @property
    def scores_to_compute(cls) -> list[str]:
        """The score kinds computed (``[]`` when not initialized)."""
        inst = cls._instance
        return [] if inst is None else inst.scores_to_compute

    @property
    def gather_on_rank0(cls) -> bool:
        """Whether rank 0's report holds every rank."""
        inst = cls._instance
        return True if inst is None else inst.gather_on_rank0

    @property
    def profiling_interval(cls) -> int:
        """One entry in this many is measured."""
        inst = cls._instance
        return 1 if inst is None else inst.profiling_interval

    @property
    def report_time_interval(cls) -> float:
        """Seconds between reports of ``generate_report_if_interval_elapsed``."""
        inst = cls._instance
        return 60.0 if inst is None else inst.report_time_interval

    @property
    def custom_sections(cls) -> dict[str, CustomSection]:
        """Section name -> :class:`CustomSection` (empty when not initialized)."""
        inst = cls._instance
        return {} if inst is None else inst.custom_sections

    @property
    def cupti_manager(cls) -> KernelTimer | None:
        """The kernel timer, or None when not initialized."""
        inst = cls._instance
        return None if inst is None else inst.kernel_timer

    @property
    def reporter(cls) -> ReportGenerator | None:
        """The report generator, or None when not initialized."""
        inst = cls._instance
        return None if inst is None else inst.reporter

    @property
    def report_interval_tracker(cls) -> ReportIntervalTracker | None:
        """The interval tracker, or None when not initialized."""
        inst = cls._instance
        return None if inst is None else inst.report_interval_tracker

    @property
    def original_callables(cls) -> dict[CallableId, object]:
        """CallableId -> the callable it replaced (empty when not initialized)."""
        inst = cls._instance
        return {} if inst is None else inst.original_callables


class Detector(metaclass=_ClassAttributes):
    """NVRx's class-method API over one process-wide :class:`StragglerDetector`.

    Every class method and class attribute forwards to that instance
    (:meth:`instance`); :meth:`use` serves another one.
    """

    _instance: ClassVar[StragglerDetector | None] = None

    def __init__(self) -> None:
        raise RuntimeError(
            "class Detector should not be instantiated; use its class methods, or create a "
            "StragglerDetector for an instance of your own"
        )

    @classmethod
    def initialize(
        cls,
        scores_to_compute: str | Sequence[str] = "all",
        gather_on_rank0: bool = True,
        profiling_interval: int = 1,
        report_time_interval: float = 60,
        node_name: str | None = None,
        **options: Any,
    ) -> StragglerDetector:
        """Create the process-wide detector; a second call keeps the first one.

        ``options`` are the keyword-only parameters of :class:`StragglerDetector`.
        Returns the instance in use.
        """
        current = cls._instance
        if current is not None:
            wanted = {
                "scores_to_compute": tuple(parse_scores_to_compute(scores_to_compute)),
                "gather_on_rank0": gather_on_rank0,
                "profiling_interval": profiling_interval,
                "report_time_interval": float(report_time_interval),
                "node_name": node_name if node_name is not None else current.node_name,
            }
            if wanted != current.settings or options:
                log.warning(
                    "Detector.initialize: already initialized with %s; the new settings %s "
                    "are ignored (call Detector.shutdown() first to change them)",
                    current.settings,
                    {**wanted, **options},
                )
            return current
        instance = StragglerDetector(
            scores_to_compute,
            gather_on_rank0,
            profiling_interval,
            report_time_interval,
            node_name,
            **options,
        )
        cls.use(instance)
        return instance

    @classmethod
    def use(cls, instance: StragglerDetector) -> None:
        """Serve the class methods from ``instance`` (the current one is shut down)."""
        if instance.closed:
            raise ValueError("Detector.use: the detector is closed")
        if cls._instance is not None and cls._instance is not instance:
            cls.shutdown()
        cls._instance = instance
        fast = vars(instance).get("detection_section")
        if fast is not None:
            # The instance's C dispatcher, called without binding (it has no __get__);
            # shutdown() puts the class method back.
            cls.detection_section = fast  # type: ignore[method-assign]

    @classmethod
    def instance(cls) -> StragglerDetector | None:
        """The instance behind the class methods, or None before ``initialize``."""
        return cls._instance

    @classmethod
    def _require(cls) -> StragglerDetector:
        inst = cls._instance
        if inst is None:
            raise RuntimeError(NOT_INITIALIZED)
        return inst

    @classmethod
    def detection_section(
        cls, name: str | None = None, profile_cuda: bool = True
    ) -> SectionContext:
        """Context manager timing the enclosed code as section ``name`` (see the guide).

        ``profiling_interval`` decides which entries are measured. ``name`` defaults to
        the ``file:line`` of the call.
        """
        inst = cls._instance  # _require() inlined: one Python call less per entry
        if inst is None:
            raise RuntimeError(NOT_INITIALIZED)
        return inst._sections.enter(name, profile_cuda, _getframe(1))

    @classmethod
    def wrap_callables(cls, callable_ids: list[CallableId], profile_cuda: bool = True) -> None:
        """Time each callable as section ``str(callable_id)``; may be called repeatedly."""
        cls._require().wrap_callables(callable_ids, profile_cuda)

    @classmethod
    def restore_original_callables(cls) -> None:
        """Put back every wrapped callable exactly as it was."""
        if cls._instance is not None:
            cls._instance.restore_original_callables()

    @classmethod
    def generate_report(cls) -> Report | None:
        """Score the window since the last report (collective); resets the window."""
        return cls._require().generate_report()

    @classmethod
    def generate_report_if_interval_elapsed(cls) -> Report | None:
        """Call every iteration on every rank; returns a report when the interval elapsed."""
        return cls._require().generate_report_if_interval_elapsed()

    @classmethod
    def is_interval_elapsed(cls) -> bool:
        """True if the previous ``generate_report_if_interval_elapsed`` call reported."""
        return cls._instance is not None and cls._instance.is_interval_elapsed()

    @classmethod
    def shutdown(cls) -> None:
        """Restore callables, release the kernel timer; safe to call at any time."""
        inst = cls._instance
        cls._instance = None
        cls.detection_section = _python_detection_section  # type: ignore[method-assign]
        if inst is not None:
            inst.close()


# Detector.use() may replace the class method by an instance's C dispatcher; shutdown()
# puts this one back.
_python_detection_section = Detector.__dict__["detection_section"]
