"""Learn hang-detection timeouts from the intervals a rank actually shows.

Each timeout is the safety factor times the longest interval observed on any rank
(agreed by a max all-reduce). Merged with an earlier calculated value it may shrink
by at most half the difference per calculation, and never below the safety factor
times what this run observed, so a long but legitimate interval (a checkpoint)
seen in this run is always covered.

Times are kept as integer nanoseconds of ``time.monotonic_ns()`` so the rank's hot path
(:class:`nvrx.ft.RankMonitorClient`) can update them with a few integer operations;
the public methods and attributes use seconds, as NVRx's do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from nvrx.ft.data import MAX_DURATION_S, HeartbeatTimeouts, SectionAction, SectionTimeouts

__all__ = ["SectionAction", "SectionStat", "TimeoutsCalc", "TimeoutsCalcError"]

_NS = 1_000_000_000
_logger = logging.getLogger("nvrx.ft.timeouts_calc")
_floor_logged = False


class TimeoutsCalcError(Exception):
    """Raised for a bad section event or when there is not enough data to calculate."""


class SectionStat:
    """One section's state: when it was opened (0: closed) and its longest duration (ns)."""

    __slots__ = ("max_ns", "opened_ns")

    def __init__(self) -> None:
        self.opened_ns = 0
        self.max_ns = -1


def _merge(current: float | None, new: float) -> float:
    """Grow at once to ``new``; shrink towards it by half the difference."""
    if current is None or new >= current:
        return new
    return 0.5 * current + 0.5 * new


def _to_ns(t: float | None) -> int:
    return time.monotonic_ns() if t is None else round(t * _NS)


def _seconds(ns: int) -> float:
    return -1.0 if ns < 0 else ns / _NS


class TimeoutsCalc:
    """Tracks the longest heartbeat, section and out-of-section intervals of one rank.

    Times given to the methods are ``time.monotonic()`` seconds (``None``: now).
    ``min_timeout`` (seconds) is a floor for every calculated timeout (None: none, as
    in NVRx); :class:`nvrx.ft.RankMonitorClient` passes ``min_calculated_timeout`` or,
    by default, 20 check intervals (at least 2 s).
    Section names are the configured ones; an event for another name is a
    :class:`TimeoutsCalcError`.
    """

    __slots__ = (
        "initial_max_ns",
        "last_section_close_ns",
        "min_timeout",
        "oos_max_ns",
        "open_count",
        "prev_hb_ns",
        "safety_factor",
        "sections",
        "start_ns",
        "subsequent_max_ns",
    )

    def __init__(
        self,
        sections: Iterable[str] | None = None,
        start_time: float | None = None,
        safety_factor: float = 5.0,
        min_timeout: float | None = None,
    ) -> None:
        if safety_factor < 1.0:
            raise ValueError(f"TimeoutsCalc.safety_factor: {safety_factor!r} must be >= 1.0")
        self.safety_factor = float(safety_factor)
        self.min_timeout = min_timeout
        self.start_ns = _to_ns(start_time)
        self.prev_hb_ns = 0
        self.initial_max_ns = -1
        self.subsequent_max_ns = -1
        self.oos_max_ns = -1
        self.sections: dict[str, SectionStat] = {name: SectionStat() for name in sections or ()}
        self.open_count = 0
        self.last_section_close_ns = self.start_ns

    # Seconds views, named as in NVRx.

    @property
    def start_time(self) -> float:
        """When measuring started (monotonic seconds)."""
        return self.start_ns / _NS

    @property
    def initial_max_time(self) -> float:
        """Longest time from start to the first heartbeat, or -1.0."""
        return _seconds(self.initial_max_ns)

    @property
    def subsequent_max_time(self) -> float:
        """Longest time between two heartbeats, or -1.0."""
        return _seconds(self.subsequent_max_ns)

    @property
    def out_of_section_max_time(self) -> float:
        """Longest time with no section open, or -1.0."""
        return _seconds(self.oos_max_ns)

    @property
    def section_to_max_time(self) -> dict[str, float]:
        """Longest duration of each section, or -1.0."""
        return {name: _seconds(s.max_ns) for name, s in self.sections.items()}

    @property
    def open_sections(self) -> dict[str, float]:
        """Open sections and when they were opened (monotonic seconds)."""
        return {n: s.opened_ns / _NS for n, s in self.sections.items() if s.opened_ns}

    @property
    def is_out_of_section(self) -> bool:
        """True while no section is open."""
        return not self.open_count

    def reset_start_time(self, start_time: float | None = None) -> None:
        """Measure the initial heartbeat and first out-of-section interval from now."""
        self.start_ns = _to_ns(start_time)
        if not self.open_count:
            self.last_section_close_ns = self.start_ns

    # Updates.

    def _heartbeat_ns(self, t: int) -> None:
        """Record a heartbeat at ``t`` (ns). RankMonitorClient inlines a copy: keep in step."""
        prev = self.prev_hb_ns
        if prev:
            interval = t - prev
            if interval > self.subsequent_max_ns:
                self.subsequent_max_ns = interval
        else:
            interval = t - self.start_ns
            if interval > self.initial_max_ns:
                self.initial_max_ns = interval
        self.prev_hb_ns = t

    def update_on_heartbeat(self, hb_time: float | None = None) -> None:
        """Record a heartbeat sent at ``hb_time``."""
        self._heartbeat_ns(_to_ns(hb_time))

    def _open_ns(self, stat: SectionStat, t: int) -> None:
        """Record opening a (closed) section at ``t`` (ns). The client inlines a copy."""
        if not self.open_count:
            interval = t - self.last_section_close_ns
            if interval > self.oos_max_ns:
                self.oos_max_ns = interval
        self.open_count += 1
        stat.opened_ns = t

    def _close_ns(self, stat: SectionStat, t: int) -> None:
        """Record closing an (open) section at ``t`` (ns). The client inlines a copy."""
        interval = t - stat.opened_ns
        if interval > stat.max_ns:
            stat.max_ns = interval
        stat.opened_ns = 0
        self.open_count -= 1
        if not self.open_count:
            self.last_section_close_ns = t

    def update_on_section_event(
        self, section: str | None, action: SectionAction, event_time: float | None = None
    ) -> None:
        """Record a section being opened or closed (or all sections closed) at ``event_time``."""
        t = _to_ns(event_time)
        if action is SectionAction.CLOSE_ALL:
            for stat in self.sections.values():
                if stat.opened_ns:
                    self._close_ns(stat, t)
            return
        found = self.sections.get(section) if section is not None else None
        if found is None:
            raise TimeoutsCalcError(
                f"Unknown section {section!r}; configured sections: {sorted(self.sections)}"
            )
        stat = found
        if action is SectionAction.OPEN:
            if stat.opened_ns:
                raise TimeoutsCalcError(f"Section {section!r} is already open")
            self._open_ns(stat, t)
        else:
            if not stat.opened_ns:
                raise TimeoutsCalcError(f"Section {section!r} is not open")
            self._close_ns(stat, t)

    def maybe_bump_oos_time(self, curr_time: float | None = None) -> None:
        """Count the current out-of-section interval, if no section is open."""
        if self.open_count:
            return
        interval = _to_ns(curr_time) - self.last_section_close_ns
        if interval > self.oos_max_ns:
            self.oos_max_ns = interval

    # Results.

    def can_get_hb_timeouts(self) -> bool:
        """True after at least two heartbeats (on this rank or, after a sync, any rank)."""
        return self.initial_max_ns > 0 and self.subsequent_max_ns > 0

    def get_hb_timeouts(self, current: HeartbeatTimeouts | None = None) -> HeartbeatTimeouts:
        """Calculated heartbeat timeouts, merged with ``current`` if that was calculated."""
        if not self.can_get_hb_timeouts():
            raise TimeoutsCalcError("Not enough data to compute heartbeat timeouts")
        initial = self.safety_factor * self.initial_max_ns / _NS
        subsequent = self.safety_factor * self.subsequent_max_ns / _NS
        if current is not None and current.were_calculated:
            initial = _merge(current.initial, initial)
            subsequent = _merge(current.subsequent, subsequent)
        return HeartbeatTimeouts(
            initial=self._floor(initial), subsequent=self._floor(subsequent), were_calculated=True
        )

    def _floor(self, timeout: float) -> float:
        """Raise a calculated timeout to ``min_timeout`` (saying so once per process).

        It is also capped at MAX_DURATION_S, the longest duration anything accepts.
        """
        timeout = min(timeout, MAX_DURATION_S)
        if self.min_timeout is None or timeout >= self.min_timeout:
            return timeout
        global _floor_logged
        if not _floor_logged:
            _floor_logged = True
            _logger.info(
                "a calculated timeout of %.3f s was raised to the floor of %.1f s "
                "(FaultToleranceConfig.min_calculated_timeout, --ft-min-calculated-timeout; "
                "by default 20 x workload_check_interval, at least 2 s); logged once",
                timeout,
                self.min_timeout,
            )
        return self.min_timeout

    def _selected(self, selected_sections: Iterable[str] | None) -> list[str]:
        chosen = list(self.sections if selected_sections is None else selected_sections)
        unknown = sorted(set(chosen) - set(self.sections))
        if unknown:
            raise TimeoutsCalcError(f"Unknown sections selected: {unknown}")
        return chosen

    def can_get_section_timeouts(
        self, selected_sections: Iterable[str] | None = None, calc_out_of_section: bool = True
    ) -> bool:
        """True when every selected section (and out-of-section, if asked) was observed."""
        chosen = self._selected(selected_sections) or list(self.sections)
        if any(self.sections[name].max_ns <= 0 for name in chosen):
            return False
        return not calc_out_of_section or self.oos_max_ns > 0

    def get_section_timeouts(
        self,
        selected_sections: Iterable[str] | None = None,
        calc_out_of_section: bool = True,
        current: SectionTimeouts | None = None,
    ) -> SectionTimeouts:
        """Calculated timeouts for the selected sections, merged with ``current``.

        Sections not selected keep their current value. ``selected_sections=[]``
        calculates only the out-of-section timeout (if asked).
        """
        chosen = self._selected(selected_sections)
        if not self.can_get_section_timeouts(chosen, calc_out_of_section):
            raise TimeoutsCalcError("Not enough data to compute section timeouts")
        current = current if current is not None else SectionTimeouts()
        sections: dict[str, float | None] = {name: None for name in self.sections}
        sections.update(current.section)
        for name in chosen:
            new = self.safety_factor * self.sections[name].max_ns / _NS
            was = current.section.get(name) if name in current.calculated_sections else None
            sections[name] = self._floor(_merge(was, new))
        oos = current.out_of_section
        if calc_out_of_section:
            new_oos = self.safety_factor * self.oos_max_ns / _NS
            was_oos = oos if current.is_out_of_section_calculated else None
            oos = self._floor(_merge(was_oos, new_oos))
        return SectionTimeouts(
            section=sections,
            out_of_section=oos,
            calculated_sections=set(current.calculated_sections) | set(chosen),
            is_out_of_section_calculated=current.is_out_of_section_calculated
            or calc_out_of_section,
        )

    def synchronize_all(self) -> None:
        """Max-reduce every observed interval over the default process group (a collective).

        Sections are reduced in sorted-name order, so their configured order does not
        matter. The tensor lives on the CPU unless the backend can only reduce CUDA
        tensors. Ranks with no data adopt their peers' maxima.
        """
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise TimeoutsCalcError("TimeoutsCalc.synchronize_all needs a default process group")
        names = sorted(self.sections)
        values = [
            self.initial_max_ns,
            self.subsequent_max_ns,
            self.oos_max_ns,
            *(self.sections[n].max_ns for n in names),
        ]
        device = _reduce_device(str(dist.get_backend()))
        tensor = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        reduced = [int(v) for v in tensor.cpu().tolist()]
        self.initial_max_ns, self.subsequent_max_ns, self.oos_max_ns = reduced[:3]
        for name, value in zip(names, reduced[3:], strict=True):
            self.sections[name].max_ns = value


def _reduce_device(backend: str) -> str:
    """CPU for any backend that reduces CPU tensors; CUDA only for a CUDA-only backend."""
    import torch

    parts = [p.split(":")[-1].strip().lower() for p in backend.split(",")]
    if any(p in ("gloo", "mpi", "ucc") for p in parts):
        return "cpu"
    if "nccl" in parts and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
