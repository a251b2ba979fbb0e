"""Learn hang-detection timeouts from the intervals a rank actually shows.

Each timeout is the safety factor times the longest interval observed on any rank
(agreed by a max all-reduce). Merged with an earlier calculated value it may shrink
by at most half the difference per calculation, and never below the safety factor
times what this run observed, so a long but legitimate interval (a checkpoint)
seen in this run is always covered.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable

from nvrx.ft.data import HeartbeatTimeouts, SectionTimeouts

__all__ = ["SectionAction", "TimeoutsCalc", "TimeoutsCalcError"]


class TimeoutsCalcError(Exception):
    """Raised for a bad section event or when there is not enough data to calculate."""


class SectionAction(enum.Enum):
    """What happened to a section."""

    OPEN = 1
    CLOSE = 2
    CLOSE_ALL = 3


def _merge(current: float | None, new: float) -> float:
    """Grow at once to ``new``; shrink towards it by half the difference."""
    if current is None or new >= current:
        return new
    return 0.5 * current + 0.5 * new


class TimeoutsCalc:
    """Tracks the longest heartbeat, section and out-of-section intervals of one rank.

    Times are ``time.monotonic()`` seconds. Section names are the configured ones;
    an event for another name is a :class:`TimeoutsCalcError`.
    """

    def __init__(
        self,
        sections: Iterable[str] | None = None,
        start_time: float | None = None,
        safety_factor: float = 5.0,
    ) -> None:
        if safety_factor < 1.0:
            raise ValueError(f"TimeoutsCalc.safety_factor: {safety_factor!r} must be >= 1.0")
        self.safety_factor = float(safety_factor)
        self.start_time = time.monotonic() if start_time is None else float(start_time)
        self.prev_hb_time: float | None = None
        self.count = 0
        self.initial_max_time = -1.0
        self.subsequent_max_time = -1.0
        self.out_of_section_max_time = -1.0
        self.section_to_max_time: dict[str, float] = {name: -1.0 for name in sections or ()}
        self.open_sections: dict[str, float] = {}
        self.last_section_close_time = self.start_time

    def reset_start_time(self, start_time: float | None = None) -> None:
        """Measure the initial heartbeat and first out-of-section interval from now."""
        self.start_time = time.monotonic() if start_time is None else float(start_time)
        if not self.open_sections:
            self.last_section_close_time = self.start_time

    @property
    def is_out_of_section(self) -> bool:
        """True while no section is open."""
        return not self.open_sections

    def update_on_heartbeat(self, hb_time: float | None = None) -> None:
        """Record a heartbeat sent at ``hb_time``."""
        t = time.monotonic() if hb_time is None else hb_time
        prev = self.prev_hb_time
        if prev is None:
            interval = t - self.start_time
            if interval > self.initial_max_time:
                self.initial_max_time = interval
        else:
            interval = t - prev
            if interval > self.subsequent_max_time:
                self.subsequent_max_time = interval
        self.count += 1
        self.prev_hb_time = t

    def update_on_section_event(
        self, section: str | None, action: SectionAction, event_time: float | None = None
    ) -> None:
        """Record a section being opened or closed (or all sections closed) at ``event_time``."""
        t = time.monotonic() if event_time is None else event_time
        if action is SectionAction.CLOSE_ALL:
            for name in list(self.open_sections):
                self._close(name, t)
            return
        if section not in self.section_to_max_time:
            raise TimeoutsCalcError(
                f"Unknown section {section!r}; configured sections: "
                f"{sorted(self.section_to_max_time)}"
            )
        if action is SectionAction.OPEN:
            if section in self.open_sections:
                raise TimeoutsCalcError(f"Section {section!r} is already open")
            self.maybe_bump_oos_time(t)
            self.open_sections[section] = t
        else:
            if section not in self.open_sections:
                raise TimeoutsCalcError(f"Section {section!r} is not open")
            self._close(section, t)

    def _close(self, section: str, t: float) -> None:
        interval = t - self.open_sections.pop(section)
        if interval > self.section_to_max_time[section]:
            self.section_to_max_time[section] = interval
        if not self.open_sections:
            self.last_section_close_time = t

    def maybe_bump_oos_time(self, curr_time: float | None = None) -> None:
        """Count the current out-of-section interval, if no section is open."""
        if self.open_sections:
            return
        t = time.monotonic() if curr_time is None else curr_time
        interval = t - self.last_section_close_time
        if interval > self.out_of_section_max_time:
            self.out_of_section_max_time = interval

    def can_get_hb_timeouts(self) -> bool:
        """True after at least two heartbeats (on this rank or, after a sync, any rank)."""
        return self.initial_max_time > 0 and self.subsequent_max_time > 0

    def get_hb_timeouts(self, current: HeartbeatTimeouts | None = None) -> HeartbeatTimeouts:
        """Calculated heartbeat timeouts, merged with ``current`` if that was calculated."""
        if not self.can_get_hb_timeouts():
            raise TimeoutsCalcError("Not enough data to compute heartbeat timeouts")
        initial = self.safety_factor * self.initial_max_time
        subsequent = self.safety_factor * self.subsequent_max_time
        if current is not None and current.were_calculated:
            initial = _merge(current.initial, initial)
            subsequent = _merge(current.subsequent, subsequent)
        return HeartbeatTimeouts(initial=initial, subsequent=subsequent, were_calculated=True)

    def _selected(self, selected_sections: Iterable[str] | None) -> list[str]:
        chosen = list(self.section_to_max_time if selected_sections is None else selected_sections)
        unknown = sorted(set(chosen) - set(self.section_to_max_time))
        if unknown:
            raise TimeoutsCalcError(f"Unknown sections selected: {unknown}")
        return chosen

    def can_get_section_timeouts(
        self, selected_sections: Iterable[str] | None = None, calc_out_of_section: bool = True
    ) -> bool:
        """True when every selected section (and out-of-section, if asked) was observed."""
        chosen = self._selected(selected_sections)
        if not chosen:
            chosen = list(self.section_to_max_time)
        if any(self.section_to_max_time[name] <= 0 for name in chosen):
            return False
        return not calc_out_of_section or self.out_of_section_max_time > 0

    def get_section_timeouts(
        self,
        selected_sections: Iterable[str] | None = None,
        calc_out_of_section: bool = True,
        current: SectionTimeouts | None = None,
    ) -> SectionTimeouts:
        """Calculated timeouts for the selected sections, merged with ``current``."""
        chosen = self._selected(selected_sections)
        if not self.can_get_section_timeouts(chosen, calc_out_of_section):
            raise TimeoutsCalcError("Not enough data to compute section timeouts")
        current = current if current is not None else SectionTimeouts()
        sections: dict[str, float | None] = {name: None for name in self.section_to_max_time}
        sections.update(current.section)
        for name in chosen:
            new = self.safety_factor * self.section_to_max_time[name]
            was = current.section.get(name) if name in current.calculated_sections else None
            sections[name] = _merge(was, new)
        oos = current.out_of_section
        if calc_out_of_section:
            new_oos = self.safety_factor * self.out_of_section_max_time
            was_oos = oos if current.is_out_of_section_calculated else None
            oos = _merge(was_oos, new_oos)
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
        names = sorted(self.section_to_max_time)
        values = [
            self.initial_max_time,
            self.subsequent_max_time,
            self.out_of_section_max_time,
            *(self.section_to_max_time[n] for n in names),
        ]
        device = _reduce_device(str(dist.get_backend()))
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        reduced = tensor.cpu().tolist()
        self.initial_max_time, self.subsequent_max_time, self.out_of_section_max_time = reduced[:3]
        for name, value in zip(names, reduced[3:], strict=False):
            self.section_to_max_time[name] = value


def _reduce_device(backend: str) -> str:
    """CPU for any backend that reduces CPU tensors; CUDA only for a CUDA-only backend."""
    import torch

    parts = [p.split(":")[-1].strip().lower() for p in backend.split(",")]
    if any(p in ("gloo", "mpi", "ucc") for p in parts):
        return "cpu"
    if "nccl" in parts and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"
