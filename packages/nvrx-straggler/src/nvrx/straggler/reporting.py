"""Straggler reports: what the scores are, who is slow, and how ranks agree on it.

:class:`ReportGenerator` turns one window of section and kernel summaries into a
:class:`Report`. Per report, in steady state (no new names), it issues at most two
collectives: one MIN all-reduce of a header and the relative-score references, and,
with ``gather_on_rank0``, one gather of each rank's scores to rank 0. New names add
one JSON name exchange (two all-gathers) and a repeat of the all-reduce. Individual
scores without gathering need no collective at all.

Individual baseline: for each section and kernel key, the smallest window median
among the last ``individual_baseline_windows`` reports in which the rank recorded it,
the current one included. A lucky window therefore lifts the bar for that many
reports only, and a lasting change of speed becomes the new normal after as many
reports (the relative score still shows it against other ranks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from nvrx.straggler.comm import Comm
from nvrx.straggler.kernels import KernelTimingStatus
from nvrx.straggler.names import NameMapper
from nvrx.straggler.scoring import (
    Comparability,
    decode_slots,
    encode_kernel_slots,
    encode_section_slots,
    gpu_scores,
    section_scores,
)
from nvrx.straggler.statistics import KERNEL_TIME_UNIT, SECTION_TIME_UNIT, Statistic

__all__ = [
    "DEFAULT_COMM_KERNEL_PATTERN",
    "INDIVIDUAL_PERF_SCORES",
    "RELATIVE_PERF_SCORES",
    "NonComparable",
    "Report",
    "ReportGenerator",
    "StragglerId",
    "parse_scores_to_compute",
]

log = logging.getLogger(__name__)

RELATIVE_PERF_SCORES = "relative_perf_scores"
INDIVIDUAL_PERF_SCORES = "individual_perf_scores"

DEFAULT_COMM_KERNEL_PATTERN = (
    r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all"
    r"|userbuffers|nvshmem|cross_device_reduce|multimem|one_shot|two_shot"
)
"""Kernel keys matching this regex are communication and are left out of GPU scores:
their time depends on the slowest peer, not on the rank that runs them."""

_HEAD = 6  # gpu_indiv, code, gpu_rel, code, gpu kernel time ms, dropped records
_PER_SECTION = 5  # indiv, code, rel, code, median ms


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
    """A rank that got no score of some kind, and why (instead of a silent NaN).

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

    Score mappings hold only ranks that could be scored; the others are listed in
    ``non_comparable`` with the reason. Section times are in milliseconds, kernel times
    in microseconds, ``generate_report_elapsed_time`` in milliseconds.
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

    def identify_stragglers(
        self,
        gpu_rel_threshold: float = 0.75,
        section_rel_threshold: float = 0.75,
        gpu_indiv_threshold: float = 0.75,
        section_indiv_threshold: float = 0.75,
    ) -> dict[str, Any]:
        """Ranks whose score is strictly below a threshold, by score kind.

        Keys: ``straggler_gpus_relative``, ``straggler_gpus_individual`` (sets of
        :class:`StragglerId`), ``straggler_sections_relative`` and
        ``straggler_sections_individual`` (section -> set, only sections with one).
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: string keys, statistics by name, units spelled out."""

        def by_rank(m: Mapping[int, float]) -> dict[str, float]:
            return {str(r): v for r, v in sorted(m.items())}

        def nested(m: Mapping[str, Mapping[int, float]]) -> dict[str, dict[str, float]]:
            return {name: by_rank(v) for name, v in sorted(m.items())}

        def summaries(m: Mapping[str, Mapping[Statistic, float]]) -> dict[str, dict[str, float]]:
            return {name: {str(k): v for k, v in s.items()} for name, s in sorted(m.items())}

        return {
            "rank": self.rank,
            "gather_on_rank0": self.gather_on_rank0,
            "units": {
                "section_times": SECTION_TIME_UNIT,
                "kernel_times": KERNEL_TIME_UNIT,
                "gpu_kernel_times": "ms",
                "generate_report_elapsed_time": "ms",
            },
            "gpu_relative_perf_scores": by_rank(self.gpu_relative_perf_scores),
            "gpu_individual_perf_scores": by_rank(self.gpu_individual_perf_scores),
            "section_relative_perf_scores": nested(self.section_relative_perf_scores),
            "section_individual_perf_scores": nested(self.section_individual_perf_scores),
            "section_median_times": nested(self.section_median_times),
            "gpu_kernel_times": by_rank(self.gpu_kernel_times),
            "dropped_kernel_records": {
                str(r): v for r, v in sorted(self.dropped_kernel_records.items())
            },
            "rank_to_node": {str(r): n for r, n in sorted(self.rank_to_node.items())},
            "non_comparable": [dataclasses.asdict(n) for n in self.non_comparable],
            "local_section_summaries": summaries(self.local_section_summaries),
            "local_kernel_summaries": summaries(self.local_kernel_summaries),
            "kernel_timing": (
                None if self.kernel_timing is None else dataclasses.asdict(self.kernel_timing)
            ),
            "generate_report_elapsed_time": self.generate_report_elapsed_time,
        }

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON text (NaN never appears: unscored ranks are omitted)."""
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    def format_table(self, max_rows: int = 5) -> str:
        """A compact text table of the worst ranks per score and section.

        GPU rows show the rank's total kernel time in the window, section rows the
        section's median time, both in milliseconds.
        """
        lines: list[str] = []
        node = self.rank_to_node

        def block(
            title: str, scores: Mapping[int, float], times: Mapping[int, float], unit: str
        ) -> None:
            if not scores:
                return
            worst = sorted(scores.items(), key=lambda kv: (kv[1], kv[0]))[:max_rows]
            lines.append(f"{title} (worst {len(worst)} of {len(scores)} ranks):")
            lines.append(f"  {'rank':>6}  {'node':<20} {'score':>6}  {unit:>10}")
            for r, s in worst:
                t = times.get(r)
                ts = "-" if t is None else f"{t:.3f}"
                lines.append(f"  {r:>6}  {node.get(r, '<unknown>'):<20.20} {s:>6.3f}  {ts:>10}")

        kernel_ms = self.gpu_kernel_times
        block("GPU relative", self.gpu_relative_perf_scores, kernel_ms, "kernel ms")
        block("GPU individual", self.gpu_individual_perf_scores, kernel_ms, "kernel ms")
        for kind, by_section in (
            ("relative", self.section_relative_perf_scores),
            ("individual", self.section_individual_perf_scores),
        ):
            for name, scores in sorted(by_section.items()):
                times = self.section_median_times.get(name, {})
                block(f"Section {name!r} {kind}", scores, times, "median ms")
        if self.non_comparable:
            lines.append("Not comparable:")
            groups: dict[tuple[str, str | None, str], list[int]] = {}
            for n in self.non_comparable:
                groups.setdefault((n.score, n.section, n.reason), []).append(n.rank)
            for (score, section, reason), rs in sorted(
                groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
            ):
                where = score if section is None else f"{score} {section!r}"
                lines.append(f"  {where}: ranks {_ranges(rs)}: {reason}")
        return "\n".join(lines) if lines else "No scores in this report."


def _ranges(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


class _Baseline:
    """Rolling individual baseline: min window median over the last N reports."""

    def __init__(self, windows: int) -> None:
        self.windows = windows
        self._history: dict[str, deque[tuple[int, float]]] = {}

    def update(self, report_index: int, medians: Mapping[str, float]) -> dict[str, float]:
        oldest = report_index - self.windows
        for name, med in medians.items():
            if med > 0 and math.isfinite(med):
                self._history.setdefault(name, deque()).append((report_index, med))
        for name in list(self._history):
            hist = self._history[name]
            while hist and hist[0][0] <= oldest:
                hist.popleft()
            if not hist:
                del self._history[name]
        return {
            name: min(m for _, m in self._history[name])
            for name in medians
            if name in self._history
        }

    def clear(self) -> None:
        self._history.clear()


class ReportGenerator:
    """Computes scores from summaries and assembles reports across ranks.

    ``pg`` is the process group used by every collective (None: default group).
    ``comm_kernel_pattern`` is a regex; matching kernel keys are left out of GPU scores.
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

    def reset_individual_baselines(self) -> None:
        """Forget the individual baselines (after a deliberate change of workload)."""
        self._section_baseline.clear()
        self._kernel_baseline.clear()

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
        kernels = {
            k: v for k, v in kernel_summaries.items() if not self.comm_kernel_regex.search(k)
        }
        sections = dict(section_summaries)
        rel = self.is_computing_rel_scores
        distributed = comm.distributed
        exchange = distributed and (rel or self.gather_on_rank0)

        reduced: torch.Tensor | None = None
        self.last_agreed_interval = interval_proposal
        if not exchange:
            self.name_mapper.assign([(list(sections), list(kernels))])
            self.rank_to_node.setdefault(self.rank, self.node_name)
        if exchange or (distributed and interval_proposal is not None):
            reduced = self._all_reduce(sections, kernels, interval_proposal, exchange, rel)
            if interval_proposal is not None:
                self.last_agreed_interval = -float(reduced[1])
            reduced = reduced[2:] if exchange and rel else None
        elif rel:
            reduced = self._slots(sections, kernels)

        row = self._local_row(sections, kernels, reduced, kernel_status)
        if self.gather_on_rank0 and distributed:
            rows = comm.gather_rows(row)
            ranks = list(range(self.world_size))
        else:
            rows = row.unsqueeze(0)
            ranks = [self.rank]
        if rows is None:
            return None
        report = self._assemble(rows, ranks, sections, kernels, kernel_status, 0.0)
        elapsed = (time.perf_counter_ns() - t0) * 1e-6
        return dataclasses.replace(report, generate_report_elapsed_time=elapsed)

    # -- collectives ---------------------------------------------------------------

    def _slots(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
    ) -> torch.Tensor:
        m = self.name_mapper
        k_meds = torch.full((m.kernel_counter,), float("nan"), dtype=torch.float64)
        for name, s in kernels.items():
            kid = m.kernel_name_to_id.get(name)
            if kid is not None:
                k_meds[kid] = s[Statistic.MED]
        s_meds = torch.full((m.section_counter,), float("nan"), dtype=torch.float64)
        for name, s in sections.items():
            sid = m.section_name_to_id.get(name)
            if sid is not None:
                s_meds[sid] = s[Statistic.MED]
        return torch.cat([encode_kernel_slots(k_meds), encode_section_slots(s_meds)])

    def _all_reduce(
        self,
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
        interval_proposal: float | None,
        exchange: bool,
        rel: bool,
    ) -> torch.Tensor:
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
            header = torch.tensor([1.0 if known else 0.0, proposal], dtype=torch.float64)
            # same length on every rank: the slots cover the ids all ranks share
            vec = torch.cat([header, self._slots(sections, kernels)]) if rel else header
            reduced = self.comm.all_reduce_min(vec)
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
        reduced: torch.Tensor | None,
        kernel_status: KernelTimingStatus | None,
    ) -> torch.Tensor:
        m = self.name_mapper
        nk, ns = m.kernel_counter, m.section_counter
        nan = float("nan")
        k_meds = torch.full((1, nk), nan, dtype=torch.float64)
        k_w = torch.zeros((1, nk), dtype=torch.float64)
        for name, s in kernels.items():
            i = m.get_kernel_id(name)
            k_meds[0, i] = s[Statistic.MED]
            k_w[0, i] = s[Statistic.NUM] * s[Statistic.AVG]
        s_meds = torch.full((1, ns), nan, dtype=torch.float64)
        for name, s in sections.items():
            s_meds[0, m.get_section_id(name)] = s[Statistic.MED]

        row = torch.full((_HEAD + _PER_SECTION * ns,), nan, dtype=torch.float64)
        sec = row[_HEAD:].view(ns, _PER_SECTION)
        row[4] = float(k_w.sum()) / 1000.0
        row[5] = float(kernel_status.dropped_records if kernel_status else 0)
        sec[:, 4] = s_meds[0]
        no_data = float(Comparability.NO_DATA)
        row[1] = row[3] = no_data
        sec[:, 1] = sec[:, 3] = no_data

        if self.is_computing_indiv_scores:
            k_base = self._kernel_baseline.update(
                self.report_index, {n: s[Statistic.MED] for n, s in kernels.items()}
            )
            s_base = self._section_baseline.update(
                self.report_index, {n: s[Statistic.MED] for n, s in sections.items()}
            )
            k_ref = torch.full((nk,), nan, dtype=torch.float64)
            for name, v in k_base.items():
                k_ref[m.get_kernel_id(name)] = v
            s_ref = torch.full((ns,), nan, dtype=torch.float64)
            for name, v in s_base.items():
                s_ref[m.get_section_id(name)] = v
            score, code = gpu_scores(k_meds, k_w, k_ref, torch.ones(nk, dtype=torch.bool))
            row[0], row[1] = float(score[0]), float(code[0])
            sscore, scode = section_scores(s_meds, s_ref)
            sec[:, 0], sec[:, 1] = sscore[0], scode[0].to(torch.float64)
        if self.is_computing_rel_scores and reduced is not None:
            k_ref, common, s_ref = decode_slots(reduced, nk, ns)
            score, code = gpu_scores(k_meds, k_w, k_ref, common)
            row[2], row[3] = float(score[0]), float(code[0])
            sscore, scode = section_scores(s_meds, s_ref)
            sec[:, 2], sec[:, 3] = sscore[0], scode[0].to(torch.float64)
        return row

    def _assemble(
        self,
        rows: torch.Tensor,
        ranks: Sequence[int],
        sections: Mapping[str, Mapping[Statistic, float]],
        kernels: Mapping[str, Mapping[Statistic, float]],
        kernel_status: KernelTimingStatus | None,
        elapsed_ms: float,
    ) -> Report:
        """Turn ``[len(ranks), row]`` score rows into a Report (vectorised per column)."""
        m = self.name_mapper
        rel, indiv = self.is_computing_rel_scores, self.is_computing_indiv_scores
        ns = (rows.shape[1] - _HEAD) // _PER_SECTION
        rank_t = torch.tensor(list(ranks), dtype=torch.int64)
        per_sec = rows[:, _HEAD:].reshape(len(ranks), ns, _PER_SECTION)
        own_reason = (
            f"; kernel timing: {kernel_status.reason}"
            if kernel_status is not None and kernel_status.reason
            else ""
        )
        missing: list[NonComparable] = []

        def column(
            kind: str,
            scores: torch.Tensor,
            codes: torch.Tensor,
            what: str,
            section: str | None = None,
        ) -> dict[int, float]:
            ok = (codes == 0) & ~torch.isnan(scores)
            for i in (~ok).nonzero().flatten().tolist():
                r = int(rank_t[i])
                reason = Comparability(int(codes[i])).describe(what)
                if section is None and r == self.rank:
                    reason += own_reason
                missing.append(NonComparable(kind, r, reason, section))
            return dict(zip(rank_t[ok].tolist(), scores[ok].tolist(), strict=True))

        gpu_indiv = column("gpu_individual", rows[:, 0], rows[:, 1], "kernels") if indiv else {}
        gpu_rel = column("gpu_relative", rows[:, 2], rows[:, 3], "kernels") if rel else {}
        gpu_times = dict(zip(ranks, rows[:, 4].tolist(), strict=True))
        dropped = dict(zip(ranks, (int(d) for d in rows[:, 5].tolist()), strict=True))

        sec_rel: dict[str, dict[int, float]] = {}
        sec_indiv: dict[str, dict[int, float]] = {}
        sec_times: dict[str, dict[int, float]] = {}
        what = "time for this section"
        for sid in range(ns):
            cells = per_sec[:, sid, :]
            has_time = ~torch.isnan(cells[:, 4])
            if not bool(has_time.any()):
                continue
            name = m.get_section_name(sid)
            sec_times[name] = dict(
                zip(rank_t[has_time].tolist(), cells[has_time, 4].tolist(), strict=True)
            )
            if indiv:
                sec_indiv[name] = column("section_individual", cells[:, 0], cells[:, 1], what, name)
            if rel:
                sec_rel[name] = column("section_relative", cells[:, 2], cells[:, 3], what, name)
        if missing and len(ranks) > 1:
            log.warning(
                "straggler report: %d score(s) not comparable, e.g. rank %d %s: %s",
                len(missing),
                missing[0].rank,
                missing[0].score,
                missing[0].reason,
            )
        return Report(
            gpu_relative_perf_scores=gpu_rel,
            section_relative_perf_scores=sec_rel,
            gpu_individual_perf_scores=gpu_indiv,
            section_individual_perf_scores=sec_indiv,
            rank_to_node=dict(self.rank_to_node),
            local_section_summaries={k: dict(v) for k, v in sections.items()},
            local_kernel_summaries={k: dict(v) for k, v in kernels.items()},
            generate_report_elapsed_time=elapsed_ms,
            gather_on_rank0=self.gather_on_rank0,
            rank=self.rank,
            section_median_times=sec_times,
            gpu_kernel_times=gpu_times,
            dropped_kernel_records=dropped,
            non_comparable=tuple(missing),
            kernel_timing=kernel_status,
        )
