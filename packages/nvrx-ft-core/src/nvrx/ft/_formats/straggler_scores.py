"""The straggler-scores file: rank 0's last straggler report, for its node's launcher.

One definition of the format, used by both sides: the rank that holds a full straggler
report (rank 0 with ``gather_on_rank0``) writes it with :func:`publish_straggler_report`
(or :func:`write_straggler_scores`) to the path the launcher gives every rank in
``NVRX_STRAGGLER_SCORES_FILE``; the launcher reads it with :func:`read_straggler_scores`,
which trusts nothing in it (no symbolic link, a regular file of the reader's own user;
types, finite values, bounds, size and rank count are checked; a ``ValueError`` names
what is wrong). The launcher turns it into the ``nvrx_straggler_score`` gauges, a
``straggler_report`` journal record and the goodput's straggler wait
(:meth:`StragglerScores.wait_fraction`). Publishing runs off the training loop: one
background thread converts and writes the latest report (:func:`publish_straggler_report`,
:func:`flush_straggler_reports`). The JSON Schema ships beside this module
(:func:`straggler_scores_schema_path`).

This module imports nothing of ``nvrx.straggler``: a report is read through its
attribute names (:class:`StragglerReportLike`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import os
import pathlib
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from nvrx.ft._events import MAX_WALL_S as _MAX_WALL
from nvrx.ft._files import write_file_atomically
from nvrx.ft._formats.checks import MAX_SPAN_S as _MAX_SPAN_S
from nvrx.ft._formats.checks import check_schema_version as _check_schema_version
from nvrx.ft._formats.checks import exact_object as _object
from nvrx.ft._formats.checks import fail as _fail
from nvrx.ft._formats.checks import integer as _int
from nvrx.ft._formats.checks import number as _number
from nvrx.ft._formats.checks import sequence as _sequence
from nvrx.ft._formats.checks import text as _text
from nvrx.ft._json_files import read_json_file

__all__ = [
    "MAX_STRAGGLER_SCORES_BYTES",
    "MAX_STRAGGLER_SCORES_RANKS",
    "STRAGGLER_SCORES_ENV",
    "STRAGGLER_SCORES_SCHEMA_VERSION",
    "RankStragglerScores",
    "StragglerReportLike",
    "StragglerScores",
    "flush_straggler_reports",
    "publish_straggler_report",
    "read_straggler_scores",
    "straggler_scores_schema_path",
    "write_straggler_scores",
]

#: The variable that gives every rank the straggler-scores file's path (set by ft_launcher).
STRAGGLER_SCORES_ENV = "NVRX_STRAGGLER_SCORES_FILE"
#: The format's version; a reader refuses any other (new fields bump it).
STRAGGLER_SCORES_SCHEMA_VERSION = 1
#: Most ranks one file may hold.
MAX_STRAGGLER_SCORES_RANKS = 1 << 17
#: Bytes one rank's entry may take: its longest form (a 10-digit rank, a 64-character
#: node, every value present with 17 significant digits) is 305 bytes.
_MAX_RANK_BYTES = 320
#: Largest file read or written: MAX_STRAGGLER_SCORES_RANKS entries plus the header.
MAX_STRAGGLER_SCORES_BYTES = MAX_STRAGGLER_SCORES_RANKS * _MAX_RANK_BYTES + 64 * 1024
#: Scores are ratios (1.0: as fast as the reference); beyond this a value is garbage.
_MAX_SCORE = 1000.0
#: A host name's longest form (HOST_NAME_MAX); a longer node name is left out (null).
_MAX_NODE_CHARS = 64
_MAX_RANK = (1 << 31) - 1
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
    #: the rank's median forward-section time in seconds (``forward_section``), if known.
    forward_s: float | None = None
    #: the rank's median whole-step time in seconds (``step_section``), if known.
    step_s: float | None = None

    def __post_init__(self) -> None:
        _int("rank", self.rank)
        if self.node is not None:
            _text(f"ranks[{self.rank}].node", self.node, _MAX_NODE_CHARS)
        for name in ("gpu_relative", "gpu_individual", "section_relative", "section_individual"):
            object.__setattr__(
                self, name, _score(f"ranks[{self.rank}].{name}", getattr(self, name))
            )
        for name in ("forward_s", "step_s"):
            value = getattr(self, name)
            if value is not None:
                value = _number(f"ranks[{self.rank}].{name}", value, 0.0, _MAX_SPAN_S)
                object.__setattr__(self, name, value)

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
    #: the section whose median times give ``forward_s``: the part of a step in which the
    #: ranks compute on their own (e.g. the forward pass; None: not known).
    forward_section: str | None = None
    #: the section whose median times give ``step_s``: the whole step (None: not known).
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
        for name in ("forward_section", "step_section"):
            value = getattr(self, name)
            if value is not None:
                _text(name, value, _MAX_SECTION_CHARS, empty=False)
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
        """Rank -> median whole-step seconds, for the ranks that have one."""
        return {r.rank: r.step_s for r in self.ranks if r.step_s is not None}

    @property
    def forward_s(self) -> dict[int, float]:
        """Rank -> median forward-section seconds, for the ranks that have one."""
        return {r.rank: r.forward_s for r in self.ranks if r.forward_s is not None}

    def wait_fraction(self) -> float | None:
        """Share of each step the typical rank waited for the slowest one; None if unknown.

        ``(max - median) / step`` of the ranks' forward-section medians, ``step`` being the
        median whole-step time (equal on every rank under DDP, whose all-reduce makes the
        others wait for the slowest): the time the median rank idles per step. It sees
        slowness in the forward section only; a rank slow only in its backward pass or
        data loading shows as 0. Without step times: ``1 - median / max`` of the forward
        medians (the forward section taken as the whole step, which overstates the wait
        when the step is longer). None with fewer than two forward times, clamped to [0, 1].
        """
        forward = [v for v in self.forward_s.values() if v > 0]
        if len(forward) < 2:
            return None
        slowest, median = max(forward), _median(forward)
        steps = [v for v in self.step_s.values() if v > 0]
        step = _median(steps) if steps else slowest
        return min(max((slowest - median) / step, 0.0), 1.0)

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
            "forward_section": self.forward_section,
            "step_section": self.step_section,
            "ranks": [{k: getattr(r, k) for k in _RANK_FIELDS} for r in self.ranks],
        }

    @classmethod
    def from_dict(cls, document: object) -> StragglerScores:
        """Validate a parsed file; ``ValueError`` names the first bad field and why."""
        _check_schema_version(document, STRAGGLER_SCORES_SCHEMA_VERSION)
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
            forward_section=body["forward_section"],
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
        forward_section: str | None = None,
        step_section: str | None = None,
    ) -> StragglerScores:
        """The file's content for ``report`` (NaN scores become None); ValueError if invalid.

        ``forward_section`` and ``step_section`` name the sections whose median times (ms)
        give each rank's forward and whole-step time (:meth:`wait_fraction`); one the
        report does not hold is left out (None).
        """
        return cls.from_dict(
            _document(
                report,
                written_at=time.time() if written_at is None else written_at,  # wall clock: label
                window_start=window_start,
                window_end=window_end,
                forward_section=forward_section,
                step_section=step_section,
            )
        )


_KEYS = frozenset(f.name for f in dataclasses.fields(StragglerScores))
_RANK_FIELDS = tuple(f.name for f in dataclasses.fields(RankStragglerScores))
_RANK_KEYS = frozenset(_RANK_FIELDS)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _clean_score(value: object) -> float | None:
    """A report's score as the file holds it: NaN, non-numbers and out-of-range as None."""
    if (type(value) is float or type(value) is int) and 0.0 <= value <= _MAX_SCORE:
        return float(value)  # NaN fails both comparisons
    return None


def _worst_by_rank(by_section: Mapping[str, Mapping[int, float]]) -> dict[int, float]:
    """Rank -> its lowest comparable score over every section (one pass over the scores)."""
    worst: dict[int, float] = {}
    get = worst.get
    for scores in by_section.values():
        for rank, score in scores.items():
            if (type(score) is float or type(score) is int) and 0.0 <= score <= _MAX_SCORE:
                old = get(rank)
                if old is None or score < old:
                    worst[rank] = float(score)
    return worst


def _seconds(medians_ms: Mapping[int, float] | None) -> dict[int, float]:
    """Section medians (ms) as seconds, the impossible ones left out."""
    if not medians_ms:
        return {}
    high = _MAX_SPAN_S * 1000.0
    return {
        r: ms / 1000.0
        for r, ms in medians_ms.items()
        if (type(ms) is float or type(ms) is int) and 0.0 <= ms <= high
    }


def _median(values: list[float]) -> float:
    values.sort()
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _document(
    report: StragglerReportLike,
    *,
    written_at: float,
    window_start: float | None,
    window_end: float | None,
    forward_section: str | None,
    step_section: str | None,
) -> dict[str, Any]:
    """The file's JSON object for ``report``, built directly (no dataclass per rank).

    Values the reader would refuse are dropped here (None), so the file always reads back.
    """
    gpu_rel = report.gpu_relative_perf_scores
    gpu_ind = report.gpu_individual_perf_scores
    sec_rel = _worst_by_rank(report.section_relative_perf_scores)
    sec_ind = _worst_by_rank(report.section_individual_perf_scores)
    medians = report.section_median_times
    if forward_section is not None and forward_section not in medians:
        forward_section = None
    if step_section is not None and step_section not in medians:
        step_section = None
    forward = _seconds(medians.get(forward_section)) if forward_section else {}
    steps = _seconds(medians.get(step_section)) if step_section else {}
    nodes = report.rank_to_node
    every = set(gpu_rel) | set(gpu_ind) | set(sec_rel) | set(sec_ind) | set(forward) | set(steps)
    ranks = []
    for rank in sorted(r for r in every if type(r) is int and 0 <= r <= _MAX_RANK):
        node = nodes.get(rank)
        ranks.append(
            {
                "rank": rank,
                "node": node if type(node) is str and len(node) <= _MAX_NODE_CHARS else None,
                "gpu_relative": _clean_score(gpu_rel.get(rank)),
                "gpu_individual": _clean_score(gpu_ind.get(rank)),
                "section_relative": sec_rel.get(rank),
                "section_individual": sec_ind.get(rank),
                "forward_s": forward.get(rank),
                "step_s": steps.get(rank),
            }
        )
    if len(ranks) > MAX_STRAGGLER_SCORES_RANKS:
        raise ValueError(f"{len(ranks)} ranks, more than {MAX_STRAGGLER_SCORES_RANKS}")
    return {
        "schema_version": STRAGGLER_SCORES_SCHEMA_VERSION,
        "written_at": written_at,
        "window_start": window_start,
        "window_end": window_end,
        "forward_section": forward_section,
        "step_section": step_section,
        "ranks": ranks,
    }


def straggler_scores_schema_path() -> pathlib.Path:
    """The JSON Schema (draft 2020-12) of the straggler-scores file, shipped in the wheel."""
    return pathlib.Path(__file__).with_name("straggler_scores.schema.json")


def write_straggler_scores(
    path: str | os.PathLike[str], scores: StragglerScores, *, durable: bool = True
) -> None:
    """Replace ``path`` with ``scores`` in one step (no reader sees half a file); mode 0600.

    ``durable=False`` skips the fsyncs (what :func:`publish_straggler_report` does: the
    next report replaces this one anyway). The directory must exist; OSError is the
    caller's to handle.
    """
    if not isinstance(scores, StragglerScores):
        raise TypeError(f"scores is a {type(scores).__name__}, not a StragglerScores")
    _write_document(path, scores.to_dict(), durable=durable)


def _write_document(
    path: str | os.PathLike[str], document: Mapping[str, Any], *, durable: bool
) -> None:
    text = json.dumps(document, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8")) + 1
    if size > MAX_STRAGGLER_SCORES_BYTES:
        raise ValueError(f"{size} bytes, more than a reader takes ({MAX_STRAGGLER_SCORES_BYTES})")
    write_file_atomically(path, text + "\n", mode=0o600, durable=durable)


def read_straggler_scores(path: str | os.PathLike[str]) -> StragglerScores:
    """Read and validate one file.

    ``ValueError`` says what is wrong (a symbolic link, not a regular file, owned by
    another user than the reader's effective one, larger than MAX_STRAGGLER_SCORES_BYTES,
    not JSON, another schema version, a field of the wrong type or range, too many
    ranks); ``OSError`` when it cannot be opened or read.
    """
    document = read_json_file(
        path, MAX_STRAGGLER_SCORES_BYTES, follow_links=False, owner_uid=os.geteuid()
    )
    return StragglerScores.from_dict(document)


class _Publisher:
    """One daemon thread that writes the latest report handed to it; the caller never waits.

    A single slot: a report handed in while an older one waits replaces it (only the
    latest matters). The thread converts and writes (no fsync), so a slow or hung disk
    holds up this thread alone. At interpreter exit the last report gets up to
    ``_EXIT_FLUSH_S`` seconds to be written (a hung disk cannot hold the exit longer). A
    forked child starts with a fresh slot and lock (the parent's thread is not there, and
    its lock may have been held at the fork). A failure is one WARNING, later ones DEBUG.
    """

    def __init__(self) -> None:
        self._warned = False
        self._exit_hook = False
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._pending: tuple[str, StragglerReportLike, dict[str, Any]] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, path: str, report: StragglerReportLike, fields: dict[str, Any]) -> None:
        with self._cond:
            if self._thread is None:  # none yet (a forked child's reset also clears it)
                self._thread = threading.Thread(
                    target=self._run, name="nvrx-straggler-scores", daemon=True
                )
                self._thread.start()
                if not self._exit_hook:
                    self._exit_hook = True
                    atexit.register(self.flush, _EXIT_FLUSH_S)
            self._pending = (path, report, fields)
            self._cond.notify_all()

    def flush(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    self._cond.wait()
                path, report, fields = self._pending
                self._pending, self._busy = None, True
            try:
                self._write(path, report, fields)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, path: str, report: StragglerReportLike, fields: dict[str, Any]) -> None:
        try:
            # The header checks here; the ranks' values were cleaned while building.
            StragglerScores(**fields)
            document = _document(report, **fields)
            _write_document(path, document, durable=False)
        except BaseException as exc:  # monitoring never breaks training
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            with contextlib.suppress(Exception):  # not even logging may stop the writer
                _logger.log(
                    level,
                    "straggler report not published to %s (%s: %s); training carries on%s",
                    path,
                    type(exc).__name__,
                    exc,
                    "" if level == logging.DEBUG else " (further failures logged at DEBUG)",
                )


#: Seconds the interpreter's exit waits for the last report to be written.
_EXIT_FLUSH_S = 2.0

_publisher = _Publisher()
os.register_at_fork(after_in_child=_publisher._reset)


def publish_straggler_report(
    report: StragglerReportLike,
    *,
    window_start: float | None = None,
    window_end: float | None = None,
    forward_section: str | None = None,
    step_section: str | None = None,
) -> bool:
    """Hand ``report`` to the writer of ``$NVRX_STRAGGLER_SCORES_FILE``; returns at once.

    True when handed over; False when the variable is unset or empty (not under
    ft_launcher). A background thread converts the report and replaces the file (atomic,
    not fsynced): the caller never waits for the disk, and the report must not change
    afterwards (the Detector makes a new one each interval). A report handed in before
    the previous one was written replaces it. A failed write is one WARNING from
    ``nvrx.ft.straggler_scores``, later ones DEBUG; never raises.
    :func:`flush_straggler_reports` waits for the write.
    """
    try:
        where = os.environ.get(STRAGGLER_SCORES_ENV, "")
        if not where:
            return False
        fields = {
            "written_at": time.time(),  # wall clock: label
            "window_start": window_start,
            "window_end": window_end,
            "forward_section": forward_section,
            "step_section": step_section,
        }
        _publisher.submit(where, report, fields)
        return True
    except Exception as exc:  # e.g. no thread can start: training carries on
        _logger.debug("straggler report not handed to the writer: %r", exc)
        return False


def flush_straggler_reports(timeout_s: float | None = 5.0) -> bool:
    """Wait until the reports handed to :func:`publish_straggler_report` are written.

    True when none is left to write (written or failed, see the log); False after
    ``timeout_s`` seconds (None: no limit) with one still being written.
    """
    return _publisher.flush(timeout_s)
