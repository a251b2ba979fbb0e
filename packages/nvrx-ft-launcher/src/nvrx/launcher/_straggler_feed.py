"""The straggler reports rank 0 publishes, read by its node's launcher.

The agent gives every rank ``NVRX_STRAGGLER_SCORES_FILE`` (nvrx.ft's
:data:`~nvrx.ft.STRAGGLER_SCORES_ENV`), a path in the launcher's private runtime
directory; rank 0 writes its reports there (:func:`nvrx.ft.publish_straggler_report`).
:class:`StragglerFeed` looks at the file from the agent's tick, at most once per period,
reads it only when its size, modification time or inode changed, and never raises: a
file that cannot be used is logged once per launcher (WARNING, later ones DEBUG) and
handed to ``on_ignored`` once per version of the file. Nothing here runs on a rank.

The largest report the format allows (131,072 ranks, about 20 MB) takes seconds to read
and validate; failure handling must not wait for it. A file larger than
:data:`SYNC_READ_BYTES` is therefore read, validated and summarised (its wait fraction,
worst rank and gauge values) by a child process
(:mod:`nvrx.launcher._straggler_summary`), so neither its parse (which would hold the
GIL for a second or more) nor its memory is the launcher's; a later tick takes the
summary. A small one (a few thousand ranks) is read at once, as before. The score gauges hold the
:data:`MAX_SCORE_GAUGES` lowest scores of each kind (the stragglers) and, as their
summary, each kind's rank count and median, so neither publishing nor scraping grows
with the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from nvrx.ft import StragglerScores, read_straggler_scores

from ._straggler_summary import KINDS, MAX_SCORE_GAUGES, lowest, stats
from .goodput import StragglerWait
from .metrics import NULL_RECORDER, NullRecorder

__all__: list[str] = []

logger = logging.getLogger("nvrx.launcher")

#: The file's name in the launcher's runtime directory.
SCORES_FILE_NAME = "straggler_scores.json"
#: How often the agent's tick may look at the file (one ``stat``).
POLL_PERIOD_S = 1.0
#: Files up to this size are read on the agent's tick; larger ones by a helper thread.
SYNC_READ_BYTES = 1 << 20
#: How long a child may take over one report before it is killed and the report skipped.
CHILD_TIMEOUT_S = 120.0
_SUMMARY_OUTPUT_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class _Summary:
    """What the launcher needs of one report, computed once (in a child for big ones)."""

    ranks: int
    fraction: float | None
    worst: tuple[int, float] | None
    gauges: dict[str, dict[int, float]]
    #: Per kind: how many ranks the report scored and their median (the gauges' summary).
    stats: dict[str, tuple[int, float | None]]


def _summarise(scores: StragglerScores) -> _Summary:
    every = {kind: scores.scores(kind) for kind in KINDS}
    return _Summary(
        ranks=len(scores.ranks),
        fraction=scores.wait_fraction(),
        worst=scores.worst("relative"),
        gauges={kind: lowest(every[kind]) for kind in KINDS},
        stats={kind: stats(every[kind]) for kind in KINDS},
    )


def _stats_from_child(raw: Any) -> tuple[int, float | None]:
    count, median = raw
    return int(count), None if median is None else float(median)


def _from_child(out: dict[str, Any]) -> tuple[StragglerScores, _Summary]:
    """The child's JSON as a report without its ranks and their summary; ValueError if bad."""
    try:
        scores = StragglerScores(
            written_at=out["written_at"],
            window_start=out["window_start"],
            window_end=out["window_end"],
            forward_section=out["forward_section"],
            step_section=out["step_section"],
        )
        worst = out["worst"]
        summary = _Summary(
            ranks=int(out["ranks"]),
            fraction=None if out["fraction"] is None else float(out["fraction"]),
            worst=None if worst is None else (int(worst[0]), float(worst[1])),
            gauges={
                kind: {int(r): float(v) for r, v in out["gauges"][kind][:MAX_SCORE_GAUGES]}
                for kind in KINDS
            },
            stats={kind: _stats_from_child(out["stats"][kind]) for kind in KINDS},
        )
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"the summary child's output is malformed: {exc!r}") from None
    return scores, summary


class _ChildReader:
    """A child process that reads and summarises one version of the file."""

    def __init__(self, path: str, version: tuple[int, int, int]) -> None:
        self.version = version
        self.started = time.monotonic()
        self.proc = subprocess.Popen(  # fixed argv: this interpreter, our module, the path
            [sys.executable, "-m", "nvrx.launcher._straggler_summary", path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )

    def done(self) -> bool:
        if self.proc.poll() is not None:
            return True
        if time.monotonic() - self.started > CHILD_TIMEOUT_S:
            self.stop()
            return True
        return False

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def result(self) -> tuple[StragglerScores, _Summary] | BaseException:
        """The summary, or why there is none (after :meth:`done`)."""
        try:
            assert self.proc.stdout is not None
            raw = self.proc.stdout.read(_SUMMARY_OUTPUT_MAX)
            self.proc.stdout.close()
            if not raw:
                return ValueError(f"the summary child ended with {self.proc.returncode}")
            out = json.loads(raw)
            if not isinstance(out, dict):
                return ValueError("the summary child's output is not an object")
            error = out.get("error")
            if isinstance(error, dict):
                why = str(error.get("why"))[:2000]
                return OSError(why) if error.get("kind") == "OSError" else ValueError(why)
            return _from_child(out)
        except (OSError, ValueError) as exc:
            return exc


class StragglerFeed:
    """Reads the straggler-scores file at ``path`` when it changes."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_ignored: Callable[[str], None] | None = None,
        period_s: float = POLL_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        metrics: NullRecorder = NULL_RECORDER,
    ) -> None:
        self.path = os.fspath(path)
        self._metrics = metrics
        self._on_ignored = on_ignored
        self._period_s = period_s
        self._clock = clock
        self._next = 0.0
        self._seen: tuple[int, int, int] | None = None
        self._warned = False
        #: Where the last report's window ended (its own end, else its writing): the next
        #: one's window starts there at the earliest, so no second counts twice.
        self._last_end: float | None = None
        #: This cycle (number, Unix time it started) and the one before.
        self._cycle: tuple[int, float] | None = None
        self._previous_cycle: int | None = None
        self._reader: _ChildReader | None = None
        # Summaries of the reports handed out, by identity (the newest few).
        self._summaries: dict[int, tuple[StragglerScores, _Summary]] = {}

    def start_cycle(self, cycle: int, started_at: float) -> None:
        """A new cycle: no score gauge of the last one stays (its rank 0 may have moved to
        another node, its world may have been larger), and a report without a window of
        its own starts none in the previous cycle."""
        if self._cycle is not None:
            self._previous_cycle = self._cycle[0]
        self._cycle = (cycle, started_at)
        self._last_end = None
        for kind in KINDS:
            self._metrics.straggler_scores({}, kind)

    def _summary(self, scores: StragglerScores) -> _Summary:
        known = self._summaries.get(id(scores))
        if known is not None and known[0] is scores:
            return known[1]
        return self._remember(scores, _summarise(scores))

    def _remember(self, scores: StragglerScores, summary: _Summary) -> _Summary:
        # The newest few: a report is summarised as it is handed out, used right after.
        self._summaries = dict(list(self._summaries.items())[-3:])
        self._summaries[id(scores)] = (scores, summary)
        return summary

    def show(self, scores: StragglerScores) -> None:
        """The report's lowest scores as the ``nvrx_straggler_score`` gauges (the last
        report's only; at most :data:`MAX_SCORE_GAUGES` ranks per kind)."""
        summary = self._summary(scores)
        for kind in KINDS:
            ranks, median = summary.stats[kind]
            self._metrics.straggler_scores(summary.gauges[kind], kind, ranks=ranks, median=median)

    def worst(self, scores: StragglerScores) -> tuple[int, float] | None:
        """The rank with the lowest relative score and that score (computed once)."""
        return self._summary(scores).worst

    def rank_count(self, scores: StragglerScores) -> int:
        """How many ranks the report holds (a big one is handed out without them)."""
        return self._summary(scores).ranks

    def close(self) -> None:
        """Stop a child still reading (the launcher is going)."""
        if self._reader is not None:
            self._reader.stop()
            self._reader = None

    def cycle_of(self, scores: StragglerScores) -> int | None:
        """The cycle ``scores`` was written in: one written before this cycle started (read
        after a restart) belongs to the previous one."""
        if self._cycle is None:
            return None
        number, started_at = self._cycle
        if scores.written_at < started_at and self._previous_cycle is not None:
            return self._previous_cycle
        return number

    def poll_now(self, wait_s: float = 0.0) -> StragglerScores | None:
        """:meth:`poll` without waiting for the period (the last look before a new cycle).

        A big file being read by the helper thread is waited for up to ``wait_s``.
        """
        if self._reader is not None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._reader.proc.wait(timeout=wait_s)
        self._next = 0.0
        return self.poll()

    def poll(self) -> StragglerScores | None:
        """The new report if the file changed since the last look, else None; never raises.

        A big file is read by a child process: this returns None then, and the report
        (without its ranks: :meth:`show`, :meth:`wait`, :meth:`worst` and
        :meth:`rank_count` know them) on a later call, once read.
        """
        if self._reader is not None:
            if not self._reader.done():
                return None
            reader, self._reader = self._reader, None
            return self._collect(reader.result(), reader.version)
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self._period_s
        try:
            st = os.lstat(self.path)  # the reader refuses a link; no need to follow it
        except FileNotFoundError:
            return None  # no report yet
        except OSError as exc:
            self._ignore(exc.strerror or str(exc), None)
            return None
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._seen:
            return None
        self._seen = version
        if st.st_size > SYNC_READ_BYTES:
            try:
                self._reader = _ChildReader(self.path, version)
            except OSError as exc:  # no process to be had: try again next period
                self._seen = None
                logger.debug("straggler scores: no reader process: %r", exc)
            return None
        try:  # small: here and now
            scores = read_straggler_scores(self.path)
            result: tuple[StragglerScores, _Summary] | BaseException = (
                scores,
                _summarise(scores),
            )
        except Exception as exc:
            result = exc
        return self._collect(result, version)

    def _collect(
        self,
        result: tuple[StragglerScores, _Summary] | BaseException,
        version: tuple[int, int, int],
    ) -> StragglerScores | None:
        if isinstance(result, tuple):
            scores, summary = result
            self._remember(scores, summary)
            return scores
        if isinstance(result, FileNotFoundError):
            return None  # replaced between stat and open: the next look reads it
        if isinstance(result, (OSError, ValueError)):
            why = result.strerror if isinstance(result, OSError) and result.strerror else None
            self._ignore(why or str(result), version)
        elif isinstance(result, Exception):  # the launcher carries on whatever the file holds
            self._ignore(f"{type(result).__name__}: {result}", version)
        else:  # KeyboardInterrupt, SystemExit, MemoryError...: not the file's fault
            logger.debug("straggler scores: reading stopped: %r", result)
        return None

    def wait(self, scores: StragglerScores) -> StragglerWait | None:
        """The report's straggler wait over its window (:meth:`StragglerScores.wait_fraction`).

        The window is the report's own, else from the previous report's end to this one's
        writing, and starts no earlier than the previous report's end (this cycle's).
        None without a wait fraction (fewer than two forward times) or without a window.
        """
        start = scores.window_start if scores.window_start is not None else self._last_end
        end = scores.window_end if scores.window_end is not None else scores.written_at
        if start is not None and self._last_end is not None:
            start = max(start, self._last_end)
        self._last_end = end if self._last_end is None else max(end, self._last_end)
        fraction = self._summary(scores).fraction
        if start is None or end <= start or fraction is None:
            return None
        return StragglerWait(start, end, fraction)

    def _ignore(self, why: str, version: tuple[int, int, int] | None) -> None:
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        logger.log(
            level,
            "straggler scores %s cannot be used (%s); ignored%s",
            self.path,
            why,
            "" if level == logging.DEBUG else " (later ones logged at DEBUG)",
        )
        if self._on_ignored is not None and version is not None:
            try:
                self._on_ignored(why)
            except Exception as exc:  # journaling never stops the launcher
                logger.debug("straggler scores: on_ignored failed: %r", exc)
