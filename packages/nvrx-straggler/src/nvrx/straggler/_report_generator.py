"""Making straggler reports: scores of every rank from one window of summaries.

:class:`ReportGenerator` turns one window of section and kernel summaries into a
:class:`~nvrx.straggler.Report`. Per report, in steady state (no new names), it issues
at most two collectives: one MIN all-reduce of a header and the relative-score
references, and, with ``gather_on_rank0``, one gather of each rank's
:class:`~nvrx.straggler.rank_row.RankRow` to rank 0. New names add one JSON name
exchange (two all-gathers) and a repeat of the all-reduce. Individual scores without
gathering need no collective at all.

Each rank scores only itself (``K`` kernels, ``S`` sections, in Python: on vectors
this small that is cheaper than tensor operations); rank 0 then reads the gathered
rows a column at a time, so its cost grows as ranks x sections.

Individual baseline: for each section and kernel key, the smallest window median
among the last ``individual_baseline_windows`` reports in which the rank recorded it,
the current one included. A lucky window therefore lifts the bar for that many
reports only, and a lasting change of speed becomes the new normal after as many
reports (the relative score still shows it against other ranks).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nvrx.straggler._comm import Comm
from nvrx.straggler._drift import SustainedSlowdownRule
from nvrx.straggler._kernels import KernelTimingStatus
from nvrx.straggler._names import NameMapper
from nvrx.straggler._report import (
    INDIVIDUAL_PERF_SCORES,
    RELATIVE_PERF_SCORES,
    NonComparable,
    Report,
    parse_scores_to_compute,
)
from nvrx.straggler._scoring import (
    Comparability,
    decode_slots,
    gpu_score,
    reference_slots,
    section_score,
)
from nvrx.straggler.rank_row import GatheredRows, RankRow
from nvrx.straggler.statistics import Statistic

__all__ = ["DEFAULT_COMM_KERNEL_PATTERN", "ReportGenerator"]

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Monitoring never breaks training: a report that cannot be built is logged once."""
    if message not in _warned and len(_warned) < 64:
        _warned.add(message)
        log.warning(message)


DEFAULT_COMM_KERNEL_PATTERN = (
    r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all"
    r"|userbuffers|nvshmem|cross_device_reduce|multimem|one_shot|two_shot"
)
"""Kernel keys matching this regex are communication and are left out of GPU scores:
their time depends on the slowest peer, not on the rank that runs them."""

_NAN = math.nan
_MED, _AVG, _NUM = Statistic.MED, Statistic.AVG, Statistic.NUM

_told: set[tuple[str, str]] = set()
"""(score kind, reason) pairs already logged in this process: a lasting condition (no
GPU, no CUPTI) is said once, not at every report; reports still list it."""


class _Baseline:
    """Rolling individual baseline: min window median over the last N reports."""

    def __init__(self, windows: int) -> None:
        self.windows = windows
        self._history: dict[str, deque[tuple[int, float]]] = {}

    def update(self, report_index: int, medians: Mapping[str, float]) -> dict[str, float]:
        oldest = report_index - self.windows
        history = self._history
        for name, med in medians.items():
            if med > 0 and math.isfinite(med):
                hist = history.get(name)
                if hist is None:
                    hist = history[name] = deque()
                hist.append((report_index, med))
        for name in list(history):
            hist = history[name]
            while hist and hist[0][0] <= oldest:
                hist.popleft()
            if not hist:
                del history[name]
        return {name: min(m for _, m in history[name]) for name in medians if name in history}

    def clear(self) -> None:
        self._history.clear()


class ReportGenerator:
    """Computes scores from summaries and assembles reports across ranks.

    ``pg`` is the process group used by every collective (None: default group).
    ``comm_kernel_pattern`` is a regex; matching kernel keys are left out of GPU scores.
    ``sustained_slowdown_rule`` (None: off) flags ranks slower than their peers for
    several reports in a row (:class:`~nvrx.straggler.SustainedSlowdownRule`).
    """

    def __init__(
        self,
        scores_to_compute: str | Sequence[str] = "all",
        gather_on_rank0: bool = True,
        pg: Any = None,
        node_name: str = "<notset>",
        *,
        comm_kernel_pattern: str = DEFAULT_COMM_KERNEL_PATTERN,
        individual_baseline_windows: int = 10,
        sustained_slowdown_rule: SustainedSlowdownRule | None = None,
    ) -> None:
        self.scores_to_compute = parse_scores_to_compute(scores_to_compute)
        self.is_computing_rel_scores = RELATIVE_PERF_SCORES in self.scores_to_compute
        self.is_computing_indiv_scores = INDIVIDUAL_PERF_SCORES in self.scores_to_compute
        if not isinstance(gather_on_rank0, bool):
            raise ValueError(f"gather_on_rank0 must be a bool, got {gather_on_rank0!r}")
        self.gather_on_rank0 = gather_on_rank0
        if individual_baseline_windows < 1:
            raise ValueError(
                f"individual_baseline_windows must be >= 1, got {individual_baseline_windows!r}"
            )
        try:
            self.comm_kernel_regex = re.compile(comm_kernel_pattern)
        except re.error as e:
            raise ValueError(
                f"comm_kernel_pattern={comm_kernel_pattern!r} is not a regex: {e}"
            ) from e
        self.sustained_slowdown_rule = sustained_slowdown_rule
        self.comm = Comm(pg)
        self.group = pg
        self.node_name = node_name
        self.world_size = self.comm.world_size()
        self.rank = self.comm.rank()
        self.name_mapper = NameMapper()
        self.rank_to_node: dict[int, str] = {}
        self.report_index = 0
        self.last_agreed_interval: float | None = None
        self._section_baseline = _Baseline(individual_baseline_windows)
        self._kernel_baseline = _Baseline(individual_baseline_windows)
        self._is_comm_kernel: dict[str, bool] = {}

    def reset_individual_baselines(self) -> None:
        """Forget the individual baselines (after a deliberate change of workload)."""
        self._section_baseline.clear()
        self._kernel_baseline.clear()

    def _compute_kernels(
        self, kernel_summaries: Mapping[str, Mapping[Statistic, float]]
    ) -> dict[str, Mapping[Statistic, float]]:
        known = self._is_comm_kernel
        out = {}
        for k, v in kernel_summaries.items():
            comm = known.get(k)
            if comm is None:
                comm = known[k] = self.comm_kernel_regex.search(k) is not None
            if not comm:
                out[k] = v
        return out

    def generate_report(
        self,
        section_summaries: Mapping[str, Mapping[Statistic, float]],
        kernel_summaries: Mapping[str, Mapping[Statistic, float]],
        *,
        kernel_status: KernelTimingStatus | None = None,
        interval_proposal: float | None = None,
    ) -> Report | None:
        """Score this window; collective over the group when the mode needs it.

        Returns the report, or None on ranks other than 0 with ``gather_on_rank0``.
        ``interval_proposal`` (report interval in iterations) is agreed across ranks as
        the maximum in the same all-reduce; the result is in ``last_agreed_interval``.
        """
        t0 = time.perf_counter_ns()
        comm = self.comm
        self.world_size = comm.world_size()
        self.rank = comm.rank()
        self.report_index += 1
        kernels = self._compute_kernels(kernel_summaries)
        sections = dict(section_summaries)  # the Report holds these mappings as given
        rel = self.is_computing_rel_scores
        distributed = comm.distributed
        exchange = distributed and (rel or self.gather_on_rank0)

        reduced: list[float] | None = None
        self.last_agreed_interval = interval_proposal
        if not exchange:
            self.name_mapper.assign([(list(sections), list(kernels))])
            self.rank_to_node.setdefault(self.rank, self.node_name)
        if exchange or (distributed and interval_proposal is not None):
            header_and_slots = self._all_reduce(sections, kernels, interval_proposal, exchange, rel)
            if interval_proposal is not None:
                self.last_agreed_interval = -header_and_slots[1]
            reduced = header_and_slots[2:] if exchange and rel else None
        elif rel:
            reduced = self._slots(sections, kernels)

        row = self._local_row(sections, kernels, reduced, kernel_status)
        if self.gather_on_rank0 and distributed:
            gathered = comm.gather_rows(torch.tensor(row.encode(), dtype=torch.float64))
            if gathered is None:
                return None
            try:
                rows = GatheredRows(range(self.world_size), gathered.T.contiguous().tolist())
            except ValueError as exc:  # rows of another version or shape: skip this report
                _warn_once(f"straggler report skipped: ranks sent rows it cannot read ({exc})")
                return None
        else:
            rows = GatheredRows.from_rows([self.rank], [row.encode()])
        report = self.assemble(rows, sections, kernels, kernel_status)
        elapsed = (time.perf_counter_ns() - t0) * 1e-6
        return dataclasses.replace(report, generate_report_elapsed_time=elapsed)

    # -- collectives ---------------------------------------------------------------

    def _medians(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
    ) -> tuple[list[float], list[float]]:
        """Kernel and section medians by id (NaN: not run here); unknown names skipped."""
        m = self.name_mapper
        k_meds = [_NAN] * m.kernel_counter
        k_ids = m.kernel_name_to_id
        for name, s in kernels.items():
            kid = k_ids.get(name)
            if kid is not None:
                k_meds[kid] = s[_MED]
        s_meds = [_NAN] * m.section_counter
        s_ids = m.section_name_to_id
        for name, s in sections.items():
            sid = s_ids.get(name)
            if sid is not None:
                s_meds[sid] = s[_MED]
        return k_meds, s_meds

    def _slots(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
    ) -> list[float]:
        return reference_slots(*self._medians(sections, kernels))

    def _all_reduce(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
        interval_proposal: float | None,
        exchange: bool,
        rel: bool,
    ) -> list[float]:
        """Header ``[all names known, -interval]`` plus reference slots, MIN-reduced.

        If any rank has a name without an id, the names are exchanged and the
        all-reduce is repeated with the new ids (the first result is incomplete).
        """
        proposal = -float(interval_proposal) if interval_proposal is not None else 0.0
        for attempt in range(2):
            new_s, new_k = self.name_mapper.unknown(sections, kernels)
            known = not (new_s or new_k) and len(self.rank_to_node) == self.world_size
            if not exchange:
                known = True
            header = [1.0 if known else 0.0, proposal]
            # same length on every rank: the slots cover the ids all ranks share
            vec = header + self._slots(sections, kernels) if rel else header
            reduced: list[float] = self.comm.all_reduce_min(
                torch.tensor(vec, dtype=torch.float64)
            ).tolist()
            if reduced[0] >= 1.0 or attempt == 1:
                return reduced
            announced = self.comm.all_gather_json(
                {"node": self.node_name, "sections": new_s, "kernels": new_k}
            )
            for r, a in enumerate(announced):
                self.rank_to_node[r] = str(a["node"])
            self.name_mapper.assign([(a["sections"], a["kernels"]) for a in announced])
        raise AssertionError("unreachable")

    # -- scoring -------------------------------------------------------------------

    def _local_row(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
        reduced: Sequence[float] | None,
        kernel_status: KernelTimingStatus | None,
    ) -> RankRow:
        """This rank's scores (every kernel and section here has an id by now)."""
        m = self.name_mapper
        nk, ns = m.kernel_counter, m.section_counter
        k_meds, s_meds = self._medians(sections, kernels)
        k_w = [0.0] * nk
        k_ids = m.kernel_name_to_id
        total = 0.0
        for name, s in kernels.items():
            w = s[_NUM] * s[_AVG]
            k_w[k_ids[name]] = w
            total += w
        no_data = float(Comparability.NO_DATA)
        fields: dict[str, Any] = {
            "kernel_time_ms": total / 1000.0,
            "dropped_kernel_records": float(kernel_status.dropped_records if kernel_status else 0),
            "section_median_ms": s_meds,
            "section_individual": [_NAN] * ns,
            "section_individual_code": [no_data] * ns,
            "section_relative": [_NAN] * ns,
            "section_relative_code": [no_data] * ns,
        }
        if self.is_computing_indiv_scores:
            k_base = self._kernel_baseline.update(
                self.report_index, {n: s[_MED] for n, s in kernels.items()}
            )
            s_base = self._section_baseline.update(
                self.report_index, {n: s[_MED] for n, s in sections.items()}
            )
            k_ref = [_NAN] * nk
            for name, v in k_base.items():
                k_ref[k_ids[name]] = v
            s_ref = [_NAN] * ns
            s_ids = m.section_name_to_id
            for name, v in s_base.items():
                s_ref[s_ids[name]] = v
            score, code = gpu_score(k_meds, k_w, k_ref)
            fields["gpu_individual"], fields["gpu_individual_code"] = score, float(code)
            cells = [section_score(med, ref) for med, ref in zip(s_meds, s_ref, strict=True)]
            fields["section_individual"] = [c[0] for c in cells]
            fields["section_individual_code"] = [float(c[1]) for c in cells]
        if self.is_computing_rel_scores and reduced is not None:
            k_ref, usable, s_ref = decode_slots(reduced, nk, ns)
            score, code = gpu_score(k_meds, k_w, k_ref, usable)
            fields["gpu_relative"], fields["gpu_relative_code"] = score, float(code)
            cells = [section_score(med, ref) for med, ref in zip(s_meds, s_ref, strict=True)]
            fields["section_relative"] = [c[0] for c in cells]
            fields["section_relative_code"] = [float(c[1]) for c in cells]
        return RankRow(**fields)

    def assemble(
        self,
        rows: GatheredRows,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
        kernel_status: KernelTimingStatus | None,
    ) -> Report:
        """Turn the rows of the ranks covered into a Report, a column at a time.

        Every score mapping gets a key for every rank (NaN where not scored); the
        reasons go to ``non_comparable``.
        """
        m = self.name_mapper
        rel, indiv = self.is_computing_rel_scores, self.is_computing_indiv_scores
        ranks = rows.ranks
        own_reason = (
            f"; kernel timing: {kernel_status.reason}"
            if kernel_status is not None and kernel_status.reason
            else ""
        )
        missing: list[NonComparable] = []

        def column(
            kind: str,
            scores: Sequence[float],
            codes: Sequence[float],
            what: str,
            section: str | None = None,
        ) -> dict[int, float]:
            if any(codes):
                for i in [i for i, c in enumerate(codes) if c]:
                    r = ranks[i]
                    reason = Comparability(int(codes[i])).describe(what)
                    if section is None and r == self.rank:
                        reason += own_reason
                    missing.append(NonComparable(kind, r, reason, section))
            return dict(zip(ranks, scores, strict=True))

        head = rows.head
        gpu_indiv = (
            column("gpu_individual", head("gpu_individual"), head("gpu_individual_code"), "kernels")
            if indiv
            else {}
        )
        gpu_rel = (
            column("gpu_relative", head("gpu_relative"), head("gpu_relative_code"), "kernels")
            if rel
            else {}
        )
        gpu_times = dict(zip(ranks, head("kernel_time_ms"), strict=True))
        dropped = dict(zip(ranks, map(int, head("dropped_kernel_records")), strict=True))

        sec_rel: dict[str, dict[int, float]] = {}
        sec_indiv: dict[str, dict[int, float]] = {}
        sec_times: dict[str, dict[int, float]] = {}
        what = "time for this section"
        for sid in range(rows.num_sections):
            times = rows.section("section_median_ms", sid)
            timed = {r: t for r, t in zip(ranks, times, strict=True) if t == t}  # not NaN
            if not timed:
                continue
            name = m.get_section_name(sid)
            sec_times[name] = timed
            if indiv:
                sec_indiv[name] = column(
                    "section_individual",
                    rows.section("section_individual", sid),
                    rows.section("section_individual_code", sid),
                    what,
                    name,
                )
            if rel:
                sec_rel[name] = column(
                    "section_relative",
                    rows.section("section_relative", sid),
                    rows.section("section_relative_code", sid),
                    what,
                    name,
                )
        if missing and len(ranks) > 1:
            self._tell(missing)
        report = Report(
            gpu_relative_perf_scores=gpu_rel,
            section_relative_perf_scores=sec_rel,
            gpu_individual_perf_scores=gpu_indiv,
            section_individual_perf_scores=sec_indiv,
            # NVRx: every rank's node when gathering; else this rank's alone
            rank_to_node=(
                dict(self.rank_to_node)
                if self.gather_on_rank0
                else {self.rank: self.rank_to_node.get(self.rank, self.node_name)}
            ),
            local_section_summaries=sections,
            local_kernel_summaries=kernels,
            generate_report_elapsed_time=0.0,
            gather_on_rank0=self.gather_on_rank0,
            rank=self.rank,
            section_median_times=sec_times,
            gpu_kernel_times=gpu_times,
            dropped_kernel_records=dropped,
            non_comparable=tuple(missing),
            kernel_timing=kernel_status,
        )
        rule = self.sustained_slowdown_rule
        if rule is not None and self.gather_on_rank0 and len(ranks) > 1:
            report = dataclasses.replace(report, sustained_slowdowns=rule.update(report))
        return report

    @staticmethod
    def _tell(missing: Sequence[NonComparable]) -> None:
        """Log each kind of unscored rank once per process (reports keep listing them)."""
        groups: dict[tuple[str, str], list[int]] = {}
        for n in missing:
            key = (n.score if n.section is None else f"{n.score} {n.section!r}", n.reason)
            groups.setdefault(key, []).append(n.rank)
        for key, ranks in groups.items():
            if key in _told:
                continue
            _told.add(key)
            log.warning(
                "straggler report: %d rank(s) (e.g. rank %d) have no %s score: %s. Said once; "
                "later reports list them in Report.non_comparable",
                len(ranks),
                ranks[0],
                key[0],
                key[1],
            )
