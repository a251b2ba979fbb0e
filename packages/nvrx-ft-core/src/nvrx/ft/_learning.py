"""The rules of timeouts learned within a job: pure functions, no processes, no clock.

A rank's client applies them (see :class:`nvrx.ft.RankMonitorClient`); they decide:

- **the floor** of every calculated or learned timeout: ``min_calculated_timeout`` when
  set, else :func:`automatic_floor` (``max(2 s, 20 x workload_check_interval)``);
- **a learned value**: ``safety_factor x`` the longest interval seen, raised to the
  floor, never above the configured timeout (:func:`learned_timeout`). Longest
  intervals only grow, so a learned timeout only loosens once it is in force;
- **when learning becomes active** (:func:`pending_reason`): after the warmup steps plus
  ``learn_min_steps`` steps, and once every kind of slow event the loop declared
  (a checkpoint save, a validation pass) has been seen and the interval holding it
  measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = [
    "CHECKPOINT",
    "EPOCH",
    "EVENT_KINDS",
    "MIN_FLOOR_S",
    "VALIDATION",
    "LearnSettings",
    "automatic_floor",
    "cap_and_floor",
    "learned_timeout",
    "pending_reason",
]

#: Kinds of slow, legitimate events a loop notes (see RankMonitorClient.note_event).
CHECKPOINT = "checkpoint"
VALIDATION = "validation"
EPOCH = "epoch"
EVENT_KINDS = (CHECKPOINT, VALIDATION, EPOCH)
#: The smallest automatic floor, whatever the check interval.
MIN_FLOOR_S = 2.0
#: The automatic floor in check intervals.
FLOOR_CHECK_INTERVALS = 20


def automatic_floor(workload_check_interval: float) -> float:
    """The floor when ``min_calculated_timeout`` is None: 20 check intervals, at least 2 s.

    With the default 0.1 s interval that is 2 s: below NVRx's own detection granularity
    (its 5 s check interval), so a floored timeout is never slower than NVRx's.
    """
    return max(MIN_FLOOR_S, FLOOR_CHECK_INTERVALS * workload_check_interval)


def cap_and_floor(value: float, configured: float | None, floor: float) -> float:
    """``value`` raised to ``floor``, then never above ``configured`` (None: no cap)."""
    value = max(value, floor)
    if configured is not None and value > configured:
        return configured
    return value


def learned_timeout(
    longest_s: float | None, configured: float | None, safety_factor: float, floor: float
) -> float | None:
    """The learned timeout for one check, or ``configured`` when nothing can be learned.

    ``longest_s``: the longest interval seen (None or <= 0: none seen). A check that is
    configured off (None) stays off: learning never arms a disabled check.
    """
    if configured is None or longest_s is None or longest_s <= 0:
        return configured
    return cap_and_floor(safety_factor * longest_s, configured, floor)


@dataclasses.dataclass(frozen=True)
class LearnSettings:
    """What learning needs to know about the loop."""

    safety_factor: float
    floor: float
    warmup_steps: int
    min_steps: int
    #: Kinds of events the loop has (a subset of EVENT_KINDS) that must be seen first.
    expected: frozenset[str] = frozenset()

    @property
    def steps_needed(self) -> int:
        """Steps (heartbeats or ``step`` sections) before learning may become active."""
        return self.warmup_steps + self.min_steps


def pending_reason(steps: int, seen: Iterable[str], settings: LearnSettings) -> str | None:
    """Why learning is not active yet, or None when it may become active now.

    ``steps``: steps counted since learning was enabled; ``seen``: event kinds whose
    interval has been measured (noted, then followed by a heartbeat or section event).
    """
    if steps < settings.steps_needed:
        return f"{steps} of {settings.steps_needed} steps seen"
    missing = sorted(settings.expected - set(seen))
    if missing:
        return "waiting for a first " + " and a first ".join(missing)
    return None
