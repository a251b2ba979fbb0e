"""A :class:`~nvrx.straggler.Report` as JSON and as a text table.

The JSON layout is versioned (:data:`REPORT_SCHEMA_VERSION`, the ``schema_version``
key) and described by ``report.schema.json`` in this package (:func:`json_schema`),
so tools can build on it. NaN scores (ranks that could not be scored) are ``null``.
The table is hand-formatted: a fixed-width layout of a few rows needs no library.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from nvrx.straggler.statistics import KERNEL_TIME_UNIT, SECTION_TIME_UNIT, Statistic

if TYPE_CHECKING:
    from nvrx.straggler._report import Report

__all__ = [
    "REPORT_SCHEMA_VERSION",
    "format_table",
    "json_schema",
    "report_to_dict",
    "report_to_json",
]

REPORT_SCHEMA_VERSION = 1
"""Version of the JSON layout of :func:`report_to_dict`; raised on any incompatible change."""


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :func:`report_to_dict`'s output."""
    text = resources.files("nvrx.straggler").joinpath("report.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def _number(v: float) -> float | None:
    return None if math.isnan(v) else v


def _by_rank(m: Mapping[int, float]) -> dict[str, float | None]:
    return {str(r): _number(v) for r, v in sorted(m.items())}


def _nested(m: Mapping[str, Mapping[int, float]]) -> dict[str, dict[str, float | None]]:
    return {name: _by_rank(v) for name, v in sorted(m.items())}


def _summaries(m: Mapping[str, Mapping[Statistic, float]]) -> dict[str, dict[str, float]]:
    return {name: {str(k): v for k, v in s.items()} for name, s in sorted(m.items())}


def report_to_dict(report: Report) -> dict[str, Any]:
    """A JSON-ready form: string keys, statistics by name, units spelled out."""
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "rank": report.rank,
        "gather_on_rank0": report.gather_on_rank0,
        "units": {
            "section_times": SECTION_TIME_UNIT,
            "kernel_times": KERNEL_TIME_UNIT,
            "gpu_kernel_times": "ms",
            "generate_report_elapsed_time": "ms",
        },
        "gpu_relative_perf_scores": _by_rank(report.gpu_relative_perf_scores),
        "gpu_individual_perf_scores": _by_rank(report.gpu_individual_perf_scores),
        "section_relative_perf_scores": _nested(report.section_relative_perf_scores),
        "section_individual_perf_scores": _nested(report.section_individual_perf_scores),
        "section_median_times": _nested(report.section_median_times),
        "gpu_kernel_times": _by_rank(report.gpu_kernel_times),
        "dropped_kernel_records": {
            str(r): v for r, v in sorted(report.dropped_kernel_records.items())
        },
        "rank_to_node": {str(r): n for r, n in sorted(report.rank_to_node.items())},
        "non_comparable": [dataclasses.asdict(n) for n in report.non_comparable],
        "sustained_slowdowns": [
            {
                "rank": s.rank,
                "section": s.section,
                "slowdown": s.slowdown,
                "windows": s.windows,
                "reason": s.reason,
            }
            for s in report.sustained_slowdowns
        ],
        "local_section_summaries": _summaries(report.local_section_summaries),
        "local_kernel_summaries": _summaries(report.local_kernel_summaries),
        "kernel_timing": (
            None if report.kernel_timing is None else dataclasses.asdict(report.kernel_timing)
        ),
        "generate_report_elapsed_time": report.generate_report_elapsed_time,
    }


def report_to_json(report: Report, **kwargs: Any) -> str:
    """:func:`report_to_dict` as JSON text (never NaN: such scores are ``null``)."""
    return json.dumps(report_to_dict(report), allow_nan=False, **kwargs)


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


def format_table(report: Report, max_rows: int = 5) -> str:
    """The worst ranks per score and section, and the ranks without a score.

    GPU rows show the rank's total kernel time in the window, section rows the
    section's median time, both in milliseconds.
    """
    lines: list[str] = []
    node = report.rank_to_node

    def block(
        title: str, scores: Mapping[int, float], times: Mapping[int, float], unit: str
    ) -> None:
        scored = [(r, s) for r, s in scores.items() if not math.isnan(s)]
        if not scored:
            return
        worst = sorted(scored, key=lambda kv: (kv[1], kv[0]))[:max_rows]
        lines.append(f"{title} (worst {len(worst)} of {len(scored)} ranks):")
        lines.append(f"  {'rank':>6}  {'node':<20} {'score':>6}  {unit:>10}")
        for r, s in worst:
            t = times.get(r)
            ts = "-" if t is None or math.isnan(t) else f"{t:.3f}"
            lines.append(f"  {r:>6}  {node.get(r, '<unknown>'):<20.20} {s:>6.3f}  {ts:>10}")

    kernel_ms = report.gpu_kernel_times
    block("GPU relative", report.gpu_relative_perf_scores, kernel_ms, "kernel ms")
    block("GPU individual", report.gpu_individual_perf_scores, kernel_ms, "kernel ms")
    for kind, by_section in (
        ("relative", report.section_relative_perf_scores),
        ("individual", report.section_individual_perf_scores),
    ):
        for name, scores in sorted(by_section.items()):
            times = report.section_median_times.get(name, {})
            block(f"Section {name!r} {kind}", scores, times, "median ms")
    if report.non_comparable:
        lines.append("Not comparable:")
        groups: dict[tuple[str, str | None, str], list[int]] = {}
        for n in report.non_comparable:
            groups.setdefault((n.score, n.section, n.reason), []).append(n.rank)
        for (score, section, reason), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
        ):
            where = score if section is None else f"{score} {section!r}"
            lines.append(f"  {where}: ranks {_ranges(rs)}: {reason}")
    for s in report.sustained_slowdowns:
        lines.append(f"Sustained slowdown: {s.reason}")
    return "\n".join(lines) if lines else "No scores in this report."
