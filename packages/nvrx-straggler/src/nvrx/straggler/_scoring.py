"""Performance scores of one rank from window medians (NVRx's definitions).

Scores run from 0 (worst) to 1 (matches the reference); ``0.5`` means twice as slow.

Section score of rank ``r`` for section ``s``: ``ref_s / med_{s,r}``.
GPU score of rank ``r``: the time-weighted mean over its kernels ``k``
``sum_k w_{k,r} * ref_k / med_{k,r} / sum_k w_{k,r}`` with ``w_{k,r} = NUM * AVG``
(the rank's own total time in ``k``).

Relative reference: the smallest median among the ranks that ran the section or
kernel in this window. A kernel counts for the relative GPU score only if every rank
that recorded kernels ran it, so all ranks are compared on the same work; ranks that
recorded no kernels do not shrink that common set. Individual reference: the rank's
own baseline (see :mod:`nvrx.straggler._report_generator`).

Instead of a bare NaN, every score comes with a :class:`Comparability` code that says
why a rank could not be scored. A median of zero counts as no data.

The relative references are what one element-wise MIN all-reduce of every rank's
:func:`reference_slots` yields (:func:`decode_slots` reads it back). Each rank scores
itself; these are plain Python over one rank's ``K`` kernels and ``S`` sections,
because a handful of tensor operations on vectors this small cost more than the loop.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

__all__ = [
    "Comparability",
    "decode_slots",
    "gpu_score",
    "reference_slots",
    "section_score",
]

_INF = math.inf
_NAN = math.nan


class Comparability(enum.IntEnum):
    """Why a rank has, or has no, score of some kind."""

    SCORED = 0
    NO_DATA = 1
    NOTHING_IN_COMMON = 2
    ZERO_TIME = 3

    def describe(self, what: str) -> str:
        """A sentence for a report, ``what`` naming the data (e.g. ``"kernels"``)."""
        return {
            Comparability.SCORED: "scored",
            Comparability.NO_DATA: f"no {what} recorded on this rank in this window",
            Comparability.NOTHING_IN_COMMON: (
                f"none of this rank's {what} ran on every other rank that recorded {what}"
            ),
            Comparability.ZERO_TIME: f"the {what} of this rank add up to zero time",
        }[self]


def _present(med: float) -> bool:
    return med > 0 and med != _INF  # False for NaN


def reference_slots(kernel_meds: Sequence[float], section_meds: Sequence[float]) -> list[float]:
    """One rank's vector for the MIN all-reduce (NaN median: not run here).

    Slots ``[0, K)``: the kernel median, or +inf when absent, so MIN yields the
    reference. Slots ``[K, 2K)``: 1.0 if the rank ran the kernel or recorded no kernel
    at all, else 0.0, so MIN yields 1.0 exactly for kernels common to all recording
    ranks. Slots ``[2K, 2K + S)``: the section median or +inf.
    """
    present = [_present(m) for m in kernel_meds]
    recorded_none = not any(present)
    mins = [m if p else _INF for m, p in zip(kernel_meds, present, strict=True)]
    common = [1.0 if (p or recorded_none) else 0.0 for p in present]
    sections = [m if _present(m) else _INF for m in section_meds]
    return mins + common + sections


def decode_slots(
    reduced: Sequence[float], num_kernels: int, num_sections: int
) -> tuple[list[float], list[bool], list[float]]:
    """Kernel references, which kernels may be compared, section references (NaN: none)."""
    k = num_kernels
    k_ref = [v if v != _INF else _NAN for v in reduced[:k]]
    usable = [c >= 1.0 and _present(r) for c, r in zip(reduced[k : 2 * k], k_ref, strict=True)]
    s_ref = [v if v != _INF else _NAN for v in reduced[2 * k : 2 * k + num_sections]]
    return k_ref, usable, s_ref


def gpu_score(
    meds: Sequence[float],
    weights: Sequence[float],
    ref: Sequence[float],
    usable: Sequence[bool] | None = None,
) -> tuple[float, Comparability]:
    """One rank's GPU score and its code from per-kernel medians, weights and references.

    ``usable`` (default: all) says which kernels may be compared.
    """
    any_present = False
    any_used = False
    num = 0.0
    den = 0.0
    for i, med in enumerate(meds):
        if not (med > 0 and med != _INF):  # not present (NaN included)
            continue
        any_present = True
        r = ref[i]
        if not (r > 0 and r != _INF) or (usable is not None and not usable[i]):
            continue
        any_used = True
        w = weights[i]
        num += w * r / med
        den += w
    if not any_present:
        return _NAN, Comparability.NO_DATA
    if not any_used:
        return _NAN, Comparability.NOTHING_IN_COMMON
    if den <= 0:
        return _NAN, Comparability.ZERO_TIME
    return num / den, Comparability.SCORED


def section_score(med: float, ref: float) -> tuple[float, Comparability]:
    """One rank's score for one section (NaN median or reference: no data)."""
    if _present(med) and _present(ref):
        return ref / med, Comparability.SCORED
    return _NAN, Comparability.NO_DATA
