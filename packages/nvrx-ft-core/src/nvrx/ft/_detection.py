"""Decide from one snapshot of a rank whether it is hung, and when it next could be.

Pure functions, so every rule is testable without processes:

- Before the first heartbeat, the initial heartbeat timeout runs from init, unless the
  rank has opened a section (a sections-only workload is then judged by its sections).
- After a heartbeat, the heartbeat timeout runs from the last one.
- Every open section is checked against its own timeout (nested or overlapping); the
  most overdue one is reported. A section without a timeout is not checked.
- While no section is open, the out-of-section timeout runs from the last close (or init).
- A ``None`` timeout disables that check.
- Warmup (NVRx 0.6+): while the rank has opened at most ``warmup_steps`` ``step``
  sections, an open ``step`` is checked against the ``warmup`` section timeout (not at
  all when there is none), and the out-of-section timeout is not checked before the
  last warmup step has started. Only when ``step`` is a configured section.
"""

from __future__ import annotations

import dataclasses

from nvrx.ft._shm import RankSnapshot

__all__ = [
    "STEP_SECTION",
    "WARMUP_SECTION",
    "ActiveTimeouts",
    "Violation",
    "find_violation",
    "next_deadline_ns",
]

_NS = 1_000_000_000
#: The section whose first ``num_warmup_iterations`` openings are warmup steps.
STEP_SECTION = "step"
#: The section timeout applied to ``step`` during warmup.
WARMUP_SECTION = "warmup"


@dataclasses.dataclass(frozen=True)
class ActiveTimeouts:
    """The timeouts a monitor enforces now, in seconds (``None``: not checked)."""

    initial_heartbeat: float | None
    heartbeat: float | None
    sections: dict[str, float | None]
    out_of_section: float | None


@dataclasses.dataclass(frozen=True)
class Violation:
    """Why a rank is to be terminated; ``cause`` is one of the contract's event causes."""

    cause: str
    observed_s: float
    limit_s: float
    section: str | None = None

    @property
    def nvrx_wording(self) -> str | None:
        """NVRx's log line for this timeout, which users' alerts and NeMo's tests grep for."""
        if self.cause == "initial_heartbeat_timeout":
            return f"Did not get initial heartbeat. Waited {self.limit_s:.2f} seconds."
        if self.cause == "heartbeat_timeout":
            return f"Did not get subsequent heartbeat. Waited {self.limit_s:.2f} seconds."
        if self.cause == "section_timeout":
            return (
                f"Section '{self.section}' has been open for {self.observed_s:.2f} seconds. "
                f"Timeout is {self.limit_s:.2f} seconds."
            )
        if self.cause == "out_of_section_timeout":
            return (
                f"Was out of section for {self.observed_s:.2f} seconds. "
                f"Timeout is {self.limit_s:.2f} seconds."
            )
        return None

    @property
    def message(self) -> str:
        """One line for logs and events, with NVRx's wording after ours."""
        what = {
            "initial_heartbeat_timeout": "no first heartbeat",
            "heartbeat_timeout": "no heartbeat",
            "section_timeout": f"section {self.section!r} open",
            "out_of_section_timeout": "no section open",
        }.get(self.cause, self.cause)
        line = f"{self.cause}: {what} for {self.observed_s:.3f} s, limit {self.limit_s:.3f} s"
        nvrx = self.nvrx_wording
        return line if nvrx is None else f"{line} ({nvrx})"


def _deadlines(
    snap: RankSnapshot, timeouts: ActiveTimeouts, init_ns: int
) -> list[tuple[int, str, int, float, str | None]]:
    """(deadline_ns, cause, since_ns, limit_s, section) for every armed check."""
    out: list[tuple[int, str, int, float, str | None]] = []
    if snap.last_hb_ns:
        if timeouts.heartbeat is not None:
            since = snap.last_hb_ns
            out.append(
                (
                    since + int(timeouts.heartbeat * _NS),
                    "heartbeat_timeout",
                    since,
                    timeouts.heartbeat,
                    None,
                )
            )
    elif timeouts.initial_heartbeat is not None and not snap.sections_used:
        out.append(
            (
                init_ns + int(timeouts.initial_heartbeat * _NS),
                "initial_heartbeat_timeout",
                init_ns,
                timeouts.initial_heartbeat,
                None,
            )
        )
    warming = snap.warmup_steps > 0 and STEP_SECTION in timeouts.sections
    for name, opened in snap.open_sections:
        limit = timeouts.sections.get(name)
        if warming and name == STEP_SECTION and snap.steps_started <= snap.warmup_steps:
            limit = timeouts.sections.get(WARMUP_SECTION)
        if limit is not None:
            out.append((opened + int(limit * _NS), "section_timeout", opened, limit, name))
    if warming and snap.steps_started < snap.warmup_steps:
        return out
    if not snap.open_sections and snap.oos_since_ns and timeouts.out_of_section is not None:
        since = snap.oos_since_ns
        out.append(
            (
                since + int(timeouts.out_of_section * _NS),
                "out_of_section_timeout",
                since,
                timeouts.out_of_section,
                None,
            )
        )
    return out


def find_violation(
    snap: RankSnapshot, timeouts: ActiveTimeouts, init_ns: int, now_ns: int
) -> Violation | None:
    """The most overdue elapsed timeout, or None when the rank is within every limit."""
    worst: Violation | None = None
    worst_over = 0
    for deadline, cause, since, limit, section in _deadlines(snap, timeouts, init_ns):
        over = now_ns - deadline
        if over > 0 and (worst is None or over > worst_over):
            worst_over = over
            worst = Violation(cause, (now_ns - since) / _NS, limit, section)
    return worst


def next_deadline_ns(snap: RankSnapshot, timeouts: ActiveTimeouts, init_ns: int) -> int | None:
    """The earliest moment a timeout could elapse if the rank does nothing more."""
    deadlines = [d[0] for d in _deadlines(snap, timeouts, init_ns)]
    return min(deadlines) if deadlines else None
