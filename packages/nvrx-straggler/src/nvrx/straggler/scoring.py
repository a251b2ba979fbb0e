"""Performance scores from window medians, for any number of ranks at once.

Scores run from 0 (worst) to 1 (matches the reference); ``0.5`` means twice as slow.

Section score of rank ``r`` for section ``s``: ``ref_s / med_{s,r}``.
GPU score of rank ``r``: the time-weighted mean over its kernels ``k``
``sum_k w_{k,r} * ref_k / med_{k,r} / sum_k w_{k,r}`` with ``w_{k,r} = NUM * AVG``
(the rank's own total time in ``k``).

Relative reference: the smallest median among the ranks that ran the section or
kernel in this window. A kernel counts for the relative GPU score only if every rank
that recorded kernels ran it, so all ranks are compared on the same work; ranks that
recorded no kernels do not shrink that common set. Individual reference: the rank's
own baseline (see :class:`nvrx.straggler.reporting.ReportGenerator`).

Instead of NaN, every score comes with a :class:`Comparability` code that says why a
rank could not be scored. A median of zero counts as no data.

The relative references are what one element-wise MIN all-reduce of the encoded
vectors yields (:func:`encode_kernel_slots`, :func:`encode_section_slots`), so the
same functions serve one rank, many ranks and the simulated benchmark.
"""

from __future__ import annotations

import enum

import torch

__all__ = [
    "Comparability",
    "decode_slots",
    "encode_kernel_slots",
    "encode_section_slots",
    "gpu_scores",
    "section_scores",
]


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


def _present(meds: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(meds) & (meds > 0)


def encode_kernel_slots(meds: torch.Tensor) -> torch.Tensor:
    """Encode one rank's kernel medians (NaN: not run) for a MIN all-reduce.

    ``meds`` is ``[K]`` for one rank or ``[R, K]`` for many (simulations).

    Slots ``[0, K)``: the median, or +inf when absent, so MIN yields the reference.
    Slots ``[K, 2K)``: 1.0 if the rank ran the kernel or recorded no kernel at all,
    else 0.0, so MIN yields 1.0 exactly for kernels common to all recording ranks.
    """
    present = _present(meds)
    inf = torch.full_like(meds, float("inf"))
    mins = torch.where(present, meds, inf)
    recorded_none = ~present.any(dim=-1, keepdim=True)
    common = (present | recorded_none).to(meds.dtype)
    return torch.cat([mins, common], dim=-1)


def encode_section_slots(meds: torch.Tensor) -> torch.Tensor:
    """Encode one rank's section medians (NaN: not entered) for a MIN all-reduce."""
    return torch.where(_present(meds), meds, torch.full_like(meds, float("inf")))


def decode_slots(
    reduced: torch.Tensor, num_kernels: int, num_sections: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel references, the common-kernel mask and section references (NaN: none)."""
    k_ref = reduced[:num_kernels].clone()
    common = reduced[num_kernels : 2 * num_kernels] >= 1.0
    s_ref = reduced[2 * num_kernels : 2 * num_kernels + num_sections].clone()
    k_ref[~torch.isfinite(k_ref)] = float("nan")
    s_ref[~torch.isfinite(s_ref)] = float("nan")
    return k_ref, common & torch.isfinite(k_ref), s_ref


def gpu_scores(
    meds: torch.Tensor, weights: torch.Tensor, ref: torch.Tensor, usable: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPU scores and codes of ``R`` ranks from ``[R, K]`` medians and weights.

    ``ref`` ``[K]`` is the reference per kernel (``[R, K]`` for per-rank baselines);
    ``usable`` ``[K]`` says which kernels may be compared. Unscored ranks get NaN and
    a non-zero :class:`Comparability` code.
    """
    present = _present(meds)
    ref_b = ref.expand_as(meds)
    use = present & usable.expand_as(meds) & torch.isfinite(ref_b) & (ref_b > 0)
    safe_meds = torch.where(use, meds, torch.ones_like(meds))
    ratio = torch.where(use, ref_b / safe_meds, torch.zeros_like(meds))
    w = torch.where(use, weights, torch.zeros_like(weights))
    wsum = w.sum(dim=1)
    score = (w * ratio).sum(dim=1) / torch.where(wsum > 0, wsum, torch.ones_like(wsum))
    codes = torch.full(wsum.shape, int(Comparability.SCORED), dtype=torch.int64)
    codes[wsum <= 0] = int(Comparability.ZERO_TIME)
    codes[~use.any(dim=1)] = int(Comparability.NOTHING_IN_COMMON)
    codes[~present.any(dim=1)] = int(Comparability.NO_DATA)
    score[codes != 0] = float("nan")
    return score, codes


def section_scores(meds: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Section scores and codes from ``[R, S]`` medians and references (``[S]``/``[R, S]``)."""
    present = _present(meds)
    ref_b = ref.expand_as(meds)
    ok = present & torch.isfinite(ref_b) & (ref_b > 0)
    score = torch.where(ok, ref_b / torch.where(ok, meds, torch.ones_like(meds)), meds * 0)
    codes = torch.full(meds.shape, int(Comparability.SCORED), dtype=torch.int64)
    codes[~ok] = int(Comparability.NO_DATA)
    score[~ok] = float("nan")
    return score, codes
