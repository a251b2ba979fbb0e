"""Formatting and summarising straggler scores for logs and Lightning loggers.

Pure functions over ``rank -> score`` mappings, so they are testable without a
report: scores that are missing or not finite (a rank with nothing comparable) are
listed separately instead of breaking the ordering.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

__all__ = ["finite_scores", "format_rank_scores", "score_summary"]


def finite_scores(rank_to_score: Mapping[int, float]) -> dict[int, float]:
    """The ranks whose score is a finite number."""
    return {r: float(s) for r, s in rank_to_score.items() if s is not None and math.isfinite(s)}


def score_summary(rank_to_score: Mapping[int, float]) -> dict[str, float]:
    """``{"min", "median", "max"}`` over the finite scores; empty when there are none."""
    values = sorted(finite_scores(rank_to_score).values())
    if not values:
        return {}
    return {"min": values[0], "median": float(statistics.median(values)), "max": values[-1]}


def format_rank_scores(
    rank_to_score: Mapping[int, float], rank_to_node: Mapping[int, str], num_to_print: int
) -> str:
    """A table of the worst (and, for many ranks, the best) ``num_to_print`` ranks.

    With more than ``2 * num_to_print`` scored ranks it shows the worst
    ``num_to_print`` (worst first) and the best ``num_to_print`` (best first);
    otherwise every scored rank, worst first. Ranks without a finite score follow.
    """
    scored = finite_scores(rank_to_score)
    ordered = sorted(scored.items(), key=lambda item: (item[1], item[0]))
    n, total = num_to_print, len(ordered)

    def line(rank: int, score: float) -> str:
        return f"  Rank={rank} Node={rank_to_node.get(rank, '<unknown>')} Score={score:.2f}\n"

    out = []
    if total > 2 * n:
        out.append(f" Worst performing {n}/{total} ranks:\n")
        out.extend(line(r, s) for r, s in ordered[:n])
        out.append(f" Best performing {n}/{total} ranks:\n")
        out.extend(line(r, s) for r, s in reversed(ordered[-n:]))
    else:
        out.extend(line(r, s) for r, s in ordered)
    unscored = sorted(set(rank_to_score) - set(scored))
    if unscored:
        out.append(f" Ranks without a comparable score: {unscored}\n")
    if not rank_to_score:
        out.append("  (no scores in this report)\n")
    return "".join(out)
