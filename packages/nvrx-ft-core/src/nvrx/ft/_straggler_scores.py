"""The straggler-scores file: rank 0's last straggler report, for its node's launcher.

One definition of the format, used by both sides: the rank that holds a full straggler
report (rank 0 with ``gather_on_rank0``) writes it with :func:`publish_straggler_report`
(or :func:`write_straggler_scores`) to the path the launcher gives every rank in
``NVRX_STRAGGLER_SCORES_FILE``; the launcher reads it with :func:`read_straggler_scores`,
which trusts nothing in it (types, finite values, bounds, size and rank count are
checked; a ``ValueError`` names what is wrong). The launcher turns it into the
``nvrx_straggler_score`` gauges, a ``straggler_report`` journal record and the goodput's
straggler wait. The JSON Schema ships beside this module
(:func:`straggler_scores_schema_path`).

This module imports nothing of ``nvrx.straggler``: a report is read through its
attribute names (:class:`StragglerReportLike`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import stat
import time
from collections.abc import Mapping
from typing import Any, Protocol

from nvrx.ft._cycle_info import (
    _MAX_SPAN_S,
    _fail,
    _int,
    _number,
    _object,
    _sequence,
    _text,
)
from nvrx.ft._events import MAX_WALL_S as _MAX_WALL
from nvrx.ft._files import write_file_atomically

__all__ = [
    "MAX_STRAGGLER_SCORES_BYTES",
    "MAX_STRAGGLER_SCORES_RANKS",
    "STRAGGLER_SCORES_ENV",
    "STRAGGLER_SCORES_SCHEMA_VERSION",
    "RankStragglerScores",
    "StragglerReportLike",
    "StragglerScores",
    "publish_straggler_report",
    "read_straggler_scores",
    "straggler_scores_schema_path",
    "write_straggler_scores",
]

#: The variable that gives every rank the straggler-scores file's path (set by ft_launcher).
STRAGGLER_SCORES_ENV = "NVRX_STRAGGLER_SCORES_FILE"
#: The format's version; a reader refuses any other (new fields bump it).
STRAGGLER_SCORES_SCHEMA_VERSION = 1
#: Largest file read: room for MAX_STRAGGLER_SCORES_RANKS ranks at ~500 bytes each.
MAX_STRAGGLER_SCORES_BYTES = 64 * 1024 * 1024
#: Most ranks one file may hold.
MAX_STRAGGLER_SCORES_RANKS = 1 << 17
#: Scores are ratios (1.0: as fast as the reference); beyond this a value is garbage.
_MAX_SCORE = 1000.0
_MAX_NODE_CHARS = 255
_MAX_SECTION_CHARS = 1024
#: The score kinds a reader asks for (:meth:`StragglerScores.scores`).
_KINDS = ("relative", "individual")

_logger = logging.getLogger("nvrx.ft.straggler_scores")


class StragglerReportLike(Protocol):
    """What :func:`publish_straggler_report` reads of a report: ``nvrx.straggler.Report``'s names.

    Scores map rank to score (NaN: not comparable), section scores and section median
    times (milliseconds) map section to rank to value.
    """

    @property
    def gpu_relative_perf_scores(self) -> Mapping[int, float]: ...
    @property
    def gpu_individual_perf_scores(self) -> Mapping[int, float]: ...
    @property
    def section_relative_perf_scores(self) -> Mapping[str, Mapping[int, float]]: ...
    @property
    def section_individual_perf_scores(self) -> Mapping[str, Mapping[int, float]]: ...
    @property
    def rank_to_node(self) -> Mapping[int, str]: ...
    @property
    def section_median_times(self) -> Mapping[str, Mapping[int, float]]: ...


def _score(where: str, value: object) -> float | None:
    return None if value is None else _number(where, value, 0.0, _MAX_SCORE)


@dataclasses.dataclass(frozen=True)
class RankStragglerScores:
    """One rank's scores in a report (None: the rank had no comparable score of that kind)."""

    rank: int
    #: the node the rank runs on, as the report names it.
    node: str | None = None
    gpu_relative: float | None = None
    gpu_individual: float | None = None
    #: the rank's worst (lowest) relative score over the report's sections.
    section_relative: float | None = None
    #: the rank's worst (lowest) individual score over the report's sections.
    section_individual: float | None = None
    #: the rank's median step time in seconds (the report's step section), if known.
    step_s: float | None = None

    def __post_init__(self) -> None:
        _int("rank", self.rank)
        if self.node is not None:
            _text(f"ranks[{self.rank}].node", self.node, _MAX_NODE_CHARS)
        for name in ("gpu_relative", "gpu_individual", "section_relative", "section_individual"):
            object.__setattr__(
                self, name, _score(f"ranks[{self.rank}].{name}", getattr(self, name))
            )
        if self.step_s is not None:
            step = _number(f"ranks[{self.rank}].step_s", self.step_s, 0.0, _MAX_SPAN_S)
            object.__setattr__(self, "step_s", step)

    def score(self, kind: str) -> float | None:
        """The rank's ``kind`` score: its GPU score where it has one, else its worst section's."""
        gpu, section = (
            (self.gpu_relative, self.section_relative)
            if kind == "relative"
            else (self.gpu_individual, self.section_individual)
        )
        return gpu if gpu is not None else section


@dataclasses.dataclass(frozen=True)
class StragglerScores:
    """One straggler report as the launcher reads it: what ``NVRX_STRAGGLER_SCORES_FILE`` holds.

    Constructing one validates every field (``ValueError`` names the field and value),
    so no rank can write a file the launcher would refuse.
    """

    #: when the report was written, seconds since the epoch.
    written_at: float
    #: each rank's scores, one entry per rank.
    ranks: tuple[RankStragglerScores, ...] = ()
    #: the report window's start and end (seconds since the epoch), if the writer knows them.
    window_start: float | None = None
    window_end: float | None = None
    #: the section whose median times give ``step_s`` (None: no step times).
    step_section: str | None = None
    #: the format's version: always STRAGGLER_SCORES_SCHEMA_VERSION for an object built here.
    schema_version: int = STRAGGLER_SCORES_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if _int("schema_version", self.schema_version) != STRAGGLER_SCORES_SCHEMA_VERSION:
            _fail("schema_version", self.schema_version, f"not {STRAGGLER_SCORES_SCHEMA_VERSION}")
        object.__setattr__(
            self, "written_at", _number("written_at", self.written_at, 0.0, _MAX_WALL)
        )
        for name in ("window_start", "window_end"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _number(name, value, 0.0, _MAX_WALL))
        if (
            self.window_start is not None
            and self.window_end is not None
            and self.window_end < self.window_start
        ):
            _fail("window_end", self.window_end, f"before window_start ({self.window_start})")
        if self.step_section is not None:
            _text("step_section", self.step_section, _MAX_SECTION_CHARS, empty=False)
        ranks = tuple(_sequence("ranks", self.ranks, MAX_STRAGGLER_SCORES_RANKS))
        for i, entry in enumerate(ranks):
            if not isinstance(entry, RankStragglerScores):
                _fail(f"ranks[{i}]", entry, "not a RankStragglerScores")
        if len({r.rank for r in ranks}) != len(ranks):
            _fail("ranks", "<ranks>", "a rank appears twice")
        object.__setattr__(self, "ranks", tuple(sorted(ranks, key=lambda r: r.rank)))

    def scores(self, kind: str = "relative") -> dict[int, float]:
        """Rank -> ``kind`` (``relative`` or ``individual``) score; ranks without one left out."""
        if kind not in _KINDS:
            raise ValueError(f"kind {kind!r} is not one of {list(_KINDS)}")
        out = {r.rank: r.score(kind) for r in self.ranks}
        return {rank: score for rank, score in out.items() if score is not None}

    @property
    def step_s(self) -> dict[int, float]:
        """Rank -> median step seconds, for the ranks that have one."""
        return {r.rank: r.step_s for r in self.ranks if r.step_s is not None}

    def worst(self, kind: str = "relative") -> tuple[int, float] | None:
        """The rank with the lowest ``kind`` score and that score (lowest rank on ties)."""
        scores = self.scores(kind)
        if not scores:
            return None
        rank = min(scores, key=lambda r: (scores[r], r))
        return rank, scores[rank]

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object (every key present; ``None`` as null)."""
        return {
            "schema_version": self.schema_version,
            "written_at": self.written_at,
            "window_start": self.window_start,
            "window_end": self.window_end,
            "step_section": self.step_section,
            "ranks": [dataclasses.asdict(r) for r in self.ranks],
        }

    @classmethod
    def from_dict(cls, document: object) -> StragglerScores:
        """Validate a parsed file; ``ValueError`` names the first bad field and why."""
        if isinstance(document, Mapping) and "schema_version" in document:
            version = document["schema_version"]
            if type(version) is not int or version != STRAGGLER_SCORES_SCHEMA_VERSION:
                _fail(
                    "schema_version",
                    version,
                    f"this nvrx reads version {STRAGGLER_SCORES_SCHEMA_VERSION} only",
                )
        body = _object("straggler scores", document, _KEYS)
        entries = _sequence("ranks", body["ranks"], MAX_STRAGGLER_SCORES_RANKS)
        ranks = tuple(
            RankStragglerScores(**_object(f"ranks[{i}]", entry, _RANK_KEYS))
            for i, entry in enumerate(entries)
        )
        return cls(
            schema_version=body["schema_version"],
            written_at=body["written_at"],
            window_start=body["window_start"],
            window_end=body["window_end"],
            step_section=body["step_section"],
            ranks=ranks,
        )

    @classmethod
    def from_report(
        cls,
        report: StragglerReportLike,
        *,
        written_at: float | None = None,
        window_start: float | None = None,
        window_end: float | None = None,
        step_section: str | None = None,
    ) -> StragglerScores:
        """The file's content for ``report`` (NaN scores become None); ValueError if invalid.

        ``step_section`` names the section whose median times (ms) give each rank's
        step time; it is left out (None) when the report has no such section.
        """
        gpu_rel = dict(report.gpu_relative_perf_scores)
        gpu_ind = dict(report.gpu_individual_perf_scores)
        sec_rel = _worst_by_rank(report.section_relative_perf_scores)
        sec_ind = _worst_by_rank(report.section_individual_perf_scores)
        medians = dict(report.section_median_times)
        steps: dict[int, float] = {}
        if step_section is not None and step_section in medians:
            steps = {r: ms / 1000.0 for r, ms in medians[step_section].items() if _finite(ms)}
        else:
            step_section = None
        nodes = dict(report.rank_to_node)
        every = set(gpu_rel) | set(gpu_ind) | set(sec_rel) | set(sec_ind) | set(steps)
        ranks = tuple(
            RankStragglerScores(
                rank=rank,
                node=nodes.get(rank),
                gpu_relative=_known(gpu_rel.get(rank)),
                gpu_individual=_known(gpu_ind.get(rank)),
                section_relative=sec_rel.get(rank),
                section_individual=sec_ind.get(rank),
                step_s=steps.get(rank),
            )
            for rank in sorted(every)
        )
        return cls(
            written_at=time.time() if written_at is None else written_at,
            ranks=ranks,
            window_start=window_start,
            window_end=window_end,
            step_section=step_section,
        )


_KEYS = frozenset(f.name for f in dataclasses.fields(StragglerScores))
_RANK_KEYS = frozenset(f.name for f in dataclasses.fields(RankStragglerScores))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _known(value: object) -> float | None:
    """A report's score as the file holds it: NaN (not comparable) as None."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return value  # type: ignore[return-value]  # validated by RankStragglerScores


def _worst_by_rank(by_section: Mapping[str, Mapping[int, float]]) -> dict[int, float]:
    """Rank -> its lowest comparable score over every section."""
    worst: dict[int, float] = {}
    for scores in by_section.values():
        for rank, score in scores.items():
            if _finite(score):
                worst[rank] = min(worst.get(rank, score), score)
    return worst


def straggler_scores_schema_path() -> pathlib.Path:
    """The JSON Schema (draft 2020-12) of the straggler-scores file, shipped in the wheel."""
    return pathlib.Path(__file__).with_name("straggler_scores.schema.json")


def write_straggler_scores(path: str | os.PathLike[str], scores: StragglerScores) -> None:
    """Replace ``path`` with ``scores`` in one step (no reader sees half a file); mode 0600.

    The directory must exist; OSError is the caller's to handle.
    """
    if not isinstance(scores, StragglerScores):
        raise TypeError(f"scores is a {type(scores).__name__}, not a StragglerScores")
    text = json.dumps(scores.to_dict(), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    write_file_atomically(path, text + "\n", mode=0o600)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"holds {name}, which JSON does not allow")


def read_straggler_scores(path: str | os.PathLike[str]) -> StragglerScores:
    """Read and validate one file.

    ``ValueError`` says what is wrong (not a regular file, larger than
    MAX_STRAGGLER_SCORES_BYTES, not JSON, another schema version, a field of the wrong
    type or range, too many ranks); ``OSError`` when it cannot be opened or read.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # no FIFO hang
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(MAX_STRAGGLER_SCORES_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_STRAGGLER_SCORES_BYTES:
        raise ValueError(f"larger than {MAX_STRAGGLER_SCORES_BYTES} bytes")
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"not valid JSON: {exc}") from None
    return StragglerScores.from_dict(document)


_warned = False


def publish_straggler_report(
    report: StragglerReportLike,
    *,
    window_start: float | None = None,
    window_end: float | None = None,
    step_section: str | None = None,
) -> bool:
    """Write ``report`` to ``$NVRX_STRAGGLER_SCORES_FILE`` for the launcher; never raises.

    False when the variable is unset or empty (not under ft_launcher) or the write
    failed: the first failure is one WARNING, later ones DEBUG. Call it once per report
    (rank 0 with ``gather_on_rank0``), never in the training step: it writes a file.
    """
    global _warned
    where = os.environ.get(STRAGGLER_SCORES_ENV, "")
    if not where:
        return False
    try:
        scores = StragglerScores.from_report(
            report, window_start=window_start, window_end=window_end, step_section=step_section
        )
        write_straggler_scores(where, scores)
        return True
    except Exception as exc:  # monitoring never breaks training
        level = logging.DEBUG if _warned else logging.WARNING
        _warned = True
        _logger.log(
            level,
            "straggler report not published to %s (%s: %s); training carries on%s",
            where,
            type(exc).__name__,
            exc,
            "" if level == logging.DEBUG else " (further failures logged at DEBUG)",
        )
        return False
