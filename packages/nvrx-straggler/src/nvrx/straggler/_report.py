"""The straggler report: NVRx's :class:`Report` and what identifies stragglers in it.

Only the model lives here; :mod:`nvrx.straggler.report_format` turns a report into
JSON and tables, :mod:`nvrx.straggler._report_generator` makes reports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nvrx.straggler import report_format
from nvrx.straggler._kernels import KernelTimingStatus
from nvrx.straggler.statistics import Statistic

if TYPE_CHECKING:
    from nvrx.straggler._drift import SustainedSlowdown

__all__ = [
    "INDIVIDUAL_PERF_SCORES",
    "RELATIVE_PERF_SCORES",
    "REPORT_SCHEMA_VERSION",
    "NonComparable",
    "Report",
    "StragglerId",
    "parse_scores_to_compute",
]

RELATIVE_PERF_SCORES = "relative_perf_scores"
INDIVIDUAL_PERF_SCORES = "individual_perf_scores"

REPORT_SCHEMA_VERSION = report_format.REPORT_SCHEMA_VERSION


def parse_scores_to_compute(scores_to_compute: str | Sequence[str]) -> tuple[str, ...]:
    """Validate ``scores_to_compute``: ``"all"``, one score name, or a list of them."""
    valid = (RELATIVE_PERF_SCORES, INDIVIDUAL_PERF_SCORES)
    if isinstance(scores_to_compute, str):
        if scores_to_compute == "all":
            return valid
        items: Sequence[str] = [scores_to_compute]
    else:
        items = list(scores_to_compute)
    bad = [s for s in items if s not in valid]
    if bad or not items:
        raise ValueError(
            f"scores_to_compute={scores_to_compute!r}: expected 'all' or a non-empty list of "
            f"{list(valid)}"
        )
    return tuple(s for s in valid if s in items)


@dataclasses.dataclass(frozen=True)
class StragglerId:
    """A straggling rank and the node it runs on."""

    rank: int
    node: str


@dataclasses.dataclass(frozen=True)
class NonComparable:
    """Why a rank's score is NaN in a report.

    ``score`` is ``gpu_relative``, ``gpu_individual``, ``section_relative`` or
    ``section_individual``; ``section`` names the section for section scores.
    """

    score: str
    rank: int
    reason: str
    section: str | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """Scores of one report window (see the straggler guide for units and rules).

    The first ten fields are NVRx's, with its meaning; the others are ours and have
    defaults, so ``Report(...)`` with NVRx's fields alone works. Every score mapping
    has a key for every rank the report covers (all ranks on rank 0 with
    ``gather_on_rank0``, else this rank); a rank that could not be scored has NaN
    there and the reason in ``non_comparable``. Section times are in milliseconds,
    kernel times in microseconds, ``generate_report_elapsed_time`` in milliseconds.
    ``sustained_slowdowns`` holds what the sustained-slowdown rule flagged in this
    report (:class:`nvrx.straggler.SustainedSlowdownRule`; empty when it is off).
    """

    gpu_relative_perf_scores: Mapping[int, float]
    section_relative_perf_scores: Mapping[str, Mapping[int, float]]
    gpu_individual_perf_scores: Mapping[int, float]
    section_individual_perf_scores: Mapping[str, Mapping[int, float]]
    rank_to_node: Mapping[int, str]
    local_section_summaries: Mapping[str, Mapping[Statistic, float]]
    local_kernel_summaries: Mapping[str, Mapping[Statistic, float]]
    generate_report_elapsed_time: float
    gather_on_rank0: bool
    rank: int | None
    section_median_times: Mapping[str, Mapping[int, float]] = dataclasses.field(
        default_factory=dict
    )
    gpu_kernel_times: Mapping[int, float] = dataclasses.field(default_factory=dict)
    dropped_kernel_records: Mapping[int, int] = dataclasses.field(default_factory=dict)
    non_comparable: tuple[NonComparable, ...] = ()
    kernel_timing: KernelTimingStatus | None = None
    sustained_slowdowns: tuple[SustainedSlowdown, ...] = ()

    def identify_stragglers(
        self,
        gpu_rel_threshold: float = 0.75,
        section_rel_threshold: float = 0.75,
        gpu_indiv_threshold: float = 0.75,
        section_indiv_threshold: float = 0.75,
    ) -> dict[str, Any]:
        """Ranks whose score is strictly below a threshold, by score kind (NVRx's rule).

        Keys: ``straggler_gpus_relative``, ``straggler_gpus_individual`` (sets of
        :class:`StragglerId`), ``straggler_sections_relative`` and
        ``straggler_sections_individual`` (section -> set, only sections with one).
        NaN scores are never below a threshold.
        """

        def ranks(scores: Mapping[int, float], thr: float) -> set[StragglerId]:
            return {
                StragglerId(r, self.rank_to_node.get(r, "<unknown>"))
                for r, s in scores.items()
                if s < thr
            }

        def per_section(
            scores: Mapping[str, Mapping[int, float]], thr: float
        ) -> dict[str, set[StragglerId]]:
            found = {name: ranks(by_rank, thr) for name, by_rank in scores.items()}
            return {name: ids for name, ids in found.items() if ids}

        return {
            "straggler_gpus_relative": ranks(self.gpu_relative_perf_scores, gpu_rel_threshold),
            "straggler_gpus_individual": ranks(
                self.gpu_individual_perf_scores, gpu_indiv_threshold
            ),
            "straggler_sections_relative": per_section(
                self.section_relative_perf_scores, section_rel_threshold
            ),
            "straggler_sections_individual": per_section(
                self.section_individual_perf_scores, section_indiv_threshold
            ),
        }

    def identify_sustained_stragglers(self) -> dict[str, Any]:
        """What the sustained-slowdown rule flagged, shaped like :meth:`identify_stragglers`.

        Keys: ``straggler_gpus_relative`` (set of :class:`StragglerId`) and
        ``straggler_sections_relative`` (section -> set); ``details`` lists each
        :class:`~nvrx.straggler.SustainedSlowdown` (how slow, for how many windows).
        """
        gpus: set[StragglerId] = set()
        sections: dict[str, set[StragglerId]] = {}
        for s in self.sustained_slowdowns:
            sid = StragglerId(s.rank, self.rank_to_node.get(s.rank, "<unknown>"))
            if s.section is None:
                gpus.add(sid)
            else:
                sections.setdefault(s.section, set()).add(sid)
        return {
            "straggler_gpus_relative": gpus,
            "straggler_sections_relative": sections,
            "details": list(self.sustained_slowdowns),
        }

    def scored(self, scores: Mapping[int, float]) -> dict[int, float]:
        """The ranks of ``scores`` that have a score (not NaN)."""
        return {r: s for r, s in scores.items() if not math.isnan(s)}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (see :mod:`nvrx.straggler.report_format`)."""
        return report_format.report_to_dict(self)

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON text; NaN scores are ``null``."""
        return report_format.report_to_json(self, **kwargs)

    def format_table(self, max_rows: int = 5) -> str:
        """A compact text table of the worst ranks per score and section."""
        return report_format.format_table(self, max_rows)
