"""The per-rank row of scores that ranks exchange for a report: one definition.

Each rank scores itself and sends one :class:`RankRow` to rank 0 (``gather_on_rank0``).
On the wire a row is a flat float64 vector, equally long on every rank because
section ids are shared (:class:`~nvrx.straggler.NameMapper`); names never travel here.
Layout, version :data:`ROW_VERSION`::

    [ROW_VERSION, S, <HEAD_FIELDS>, <SECTION_FIELDS[0]> x S, ..., <SECTION_FIELDS[4]> x S]

Codes are :class:`~nvrx.straggler._scoring.Comparability` values; NaN means "no score".
:class:`GatheredRows` reads the rows of many ranks by field name, a column at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from nvrx.straggler._scoring import Comparability

__all__ = ["HEAD_FIELDS", "ROW_VERSION", "SECTION_FIELDS", "GatheredRows", "RankRow"]

ROW_VERSION = 1
"""Raised whenever the layout changes; rows of another version are refused."""

HEAD_FIELDS = (
    "gpu_individual",
    "gpu_individual_code",
    "gpu_relative",
    "gpu_relative_code",
    "kernel_time_ms",
    "dropped_kernel_records",
)
SECTION_FIELDS = (
    "section_individual",
    "section_individual_code",
    "section_relative",
    "section_relative_code",
    "section_median_ms",
)
_PREFIX = 2  # version, number of sections
_NO_DATA = float(Comparability.NO_DATA)


@dataclasses.dataclass(frozen=True)
class RankRow:
    """One rank's scores in one window; section tuples are indexed by section id."""

    gpu_individual: float = math.nan
    gpu_individual_code: float = _NO_DATA
    gpu_relative: float = math.nan
    gpu_relative_code: float = _NO_DATA
    kernel_time_ms: float = 0.0
    dropped_kernel_records: float = 0.0
    section_individual: Sequence[float] = ()
    section_individual_code: Sequence[float] = ()
    section_relative: Sequence[float] = ()
    section_relative_code: Sequence[float] = ()
    section_median_ms: Sequence[float] = ()

    @property
    def num_sections(self) -> int:
        """Sections covered (every section id known to all ranks)."""
        return len(self.section_median_ms)

    def encode(self) -> list[float]:
        """The wire form (see the module docstring)."""
        s = self.num_sections
        out = [float(ROW_VERSION), float(s)]
        out.extend(float(getattr(self, f)) for f in HEAD_FIELDS)
        for f in SECTION_FIELDS:
            cells = getattr(self, f)
            if len(cells) != s:
                raise ValueError(f"RankRow.{f} has {len(cells)} cells, expected {s}")
            out.extend(cells)
        return out

    @staticmethod
    def length(num_sections: int) -> int:
        """Length of an encoded row."""
        return _PREFIX + len(HEAD_FIELDS) + len(SECTION_FIELDS) * num_sections


class GatheredRows:
    """The encoded rows of ``ranks``, read by field: one list per column."""

    def __init__(self, ranks: Sequence[int], columns: Sequence[Sequence[float]]) -> None:
        if not columns or len(columns) < _PREFIX + len(HEAD_FIELDS):
            raise ValueError("GatheredRows: a row is shorter than its header")
        versions = set(columns[0])
        if versions != {float(ROW_VERSION)}:
            raise ValueError(
                f"straggler rows of version {sorted(versions)} received; this rank reads "
                f"version {ROW_VERSION} (mixed nvrx-straggler versions in one job?)"
            )
        sections = set(columns[1])
        if len(sections) != 1:
            raise ValueError(f"straggler rows disagree on the number of sections: {sections}")
        self.num_sections = int(columns[1][0])
        if len(columns) != RankRow.length(self.num_sections):
            raise ValueError("straggler rows are not as long as their header says")
        self.ranks = list(ranks)
        self._columns = columns

    @classmethod
    def from_rows(cls, ranks: Sequence[int], rows: Sequence[Sequence[float]]) -> GatheredRows:
        """From row-major encoded rows (one per rank)."""
        return cls(ranks, [list(c) for c in zip(*rows, strict=True)])

    def head(self, field: str) -> Sequence[float]:
        """Column ``field`` of :data:`HEAD_FIELDS`, one value per rank."""
        return self._columns[_PREFIX + HEAD_FIELDS.index(field)]

    def section(self, field: str, section_id: int) -> Sequence[float]:
        """Column ``field`` of :data:`SECTION_FIELDS` for one section, one value per rank."""
        base = _PREFIX + len(HEAD_FIELDS) + SECTION_FIELDS.index(field) * self.num_sections
        return self._columns[base + section_id]
